// Every argument name of Megatron-LM (megatron/training/arguments.py) and of Primus's Megatron
// module and model configs that this engine does not apply itself, with what it does with each:
//
//   no effect      accepted and listed once at start-up and in --print-config: logging sinks,
//                  kernel and fusion switches, communication tuning, checkpoint formats
//   applied        (here) another name of one of our keys, e.g. Megatron's dest `layernorm_epsilon`
//   not supported  would change the result and is not implemented: an error naming the key,
//                  unless the value is the one this engine always runs with (or null)
//
// The keys we apply are the training keys (config/experiment.h) and the model keys
// (model/model_spec.h); none of them has an entry here. Implementing a key moves its line from
// foreign_keys() to applied_key_sources() in foreign_keys.cpp (where its name comes from);
// test_megatron_keys fails while an entry here shadows a key we apply. One entry per line, sorted
// by name.
#pragma once

#include <string>
#include <vector>

namespace YAML { class Node; }

namespace primus::config {

enum class KeyStatus { Applied, NoEffect, NotSupported };
const char* to_string(KeyStatus s);

// Where a name comes from: Megatron-LM's arguments, Primus's configs, or both.
enum class Src { M, P, MP };

struct ForeignKey {
  const char* name;
  KeyStatus status;
  const char* engine_value;  // YAML text of the value this engine runs with (Megatron's default unless
                             // noted); for Applied: the name of our key it is another name of
  const char* note;          // why it has this status
  Src source;
};

const std::vector<ForeignKey>& foreign_keys();
// nullptr when `name` is not in the table.
const ForeignKey* find_foreign_key(const std::string& name);
// "Megatron-LM", "Primus", "Megatron-LM, Primus" or "this engine": where a key name comes from.
const char* key_source(const std::string& name);
// True when `value` leaves the engine as it is: null, the engine's value, false for a flag whose
// engine value is null, or a feature's block with `enabled: false` (lora).
bool is_engine_value(const ForeignKey& key, const YAML::Node& value);

}  // namespace primus::config
