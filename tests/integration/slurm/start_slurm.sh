#!/usr/bin/env bash
# Starts a private single-node Slurm (munged + slurmctld + slurmd) in folder $1, for tests.
# Everything lives under $1: a private munge key and socket, slurm.conf with unique ports,
# state, spool, logs and pid files, so it collides with no system Slurm or other test run.
# Prints the SLURM_CONF path on success. Stop it with stop_slurm.sh $1 (by the pids in $1).
# Needs root (Slurm's SlurmUser=root here) and Debian's slurm-wlm + munge packages.
set -euo pipefail
dir=$(realpath "${1:?usage: start_slurm.sh DIR}")
mkdir -p "$dir"
chmod 755 "$dir"  # munged runs as the munge user and must reach its folder below
for p in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$p" >/dev/null || { echo "start_slurm: '$p' not found (install slurm-wlm and munge)" >&2; exit 3; }
done
[[ $(id -u) == 0 ]] || { echo "start_slurm: needs root (SlurmUser=root)" >&2; exit 3; }
id munge >/dev/null 2>&1 || { echo "start_slurm: no 'munge' user (install munge)" >&2; exit 3; }

runuser -u munge -- test -x "$dir" || { echo "start_slurm: the munge user cannot enter $dir (chmod 755 its parents)" >&2; exit 3; }

# munge with its own key and socket.
m="$dir/munge"
mkdir -p "$m"
dd if=/dev/urandom of="$m/munge.key" bs=1 count=1024 status=none
chown -R munge:munge "$m"
chmod 755 "$m"  # the socket folder must be searchable by every client
chmod 400 "$m/munge.key"
runuser -u munge -- munged --key-file="$m/munge.key" --socket="$m/munge.socket" --pid-file="$m/munged.pid" \
  --log-file="$m/munged.log" --seed-file="$m/munged.seed"

# Two free TCP ports for slurmctld and slurmd.
free_port() {
  local p
  while :; do
    p=$(( 20000 + RANDOM % 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}
ctld_port=$(free_port)
slurmd_port=$(free_port)
while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done

host=$(hostname -s)
cpus=$(nproc)
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
cat > "$dir/slurm.conf" <<CONF
ClusterName=primustest$$
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$m/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"

# Ready when the node is idle (up to ~30 s).
for _ in $(seq 60); do
  state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
  if [[ $state == idle* ]]; then echo "$SLURM_CONF"; exit 0; fi
  sleep 0.5
done
echo "start_slurm: node did not become idle (state '${state:-none}'); logs in $dir/log" >&2
tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
exit 1
