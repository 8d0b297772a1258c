# configs/envs/MI325X.sh: AMD Instinct MI325X (sourced after base.sh; values only fill what is unset).
# The same settings as the MI300X: AMD's MI300-series training guides cover the whole family.
source "$(dirname "${BASH_SOURCE[0]}")/MI300X.sh"
