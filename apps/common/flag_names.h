// flag_names.h: one name per idea across Kiln's apps, and the old spellings that still work.
//
// The apps say what PyTorch users and most of the apps already said:
//   --dist none|local:N|mpi|nccl     how ranks are started and talk (torch.distributed)
//   --allreduce ALGO                 how gradients are averaged (ring, hd, bb, ps, native); a
//                                    benchmark that sweeps it takes a comma list (comm_bench)
//   --precision fp32|tf32|bf16|fp16  the math of a run; a benchmark that sweeps it takes a comma
//                                    list (gemm_bench --precision bf16,fp16)
//   --dtype fp32|fp16|bf16           an element type (comm_bench: the type on the wire)
//   --format idx|imagefolder|...     how the data are stored on disk (--data says where)
// A flag keeps the singular name of its idea even where a benchmark lets it take a list (as
// loader_bench --workers 0,1,2 and gemm_bench --kernels do): one name to learn, and a single
// value is a list of one.
//
// An old spelling still works: parse_flags (flag_checks.h) rewrites it into the new one before
// CLI11 sees the flags, so the new flag's checks and messages apply, and prints one line on stderr
// (rank 0 alone under mpirun) that says what to write instead:
//   comm_bench --transport local:4  ->  comm_bench: --transport local:4 is deprecated: write --dist local:4
//   train_step_bench --tf32         ->  train_step_bench: --tf32 is deprecated: write --precision tf32
//   gemm_bench --dtypes bf16,f16    ->  gemm_bench: --dtypes bf16,f16 is deprecated: write --precision bf16,fp16
#pragma once

#include <string>
#include <vector>

namespace kiln::apps {

// One old spelling of an app's flag or value. Made by the three functions below.
struct OldSpelling {
  enum class Kind { kFlag, kSwitch, kValue };
  Kind kind;
  std::string old_flag;   // kFlag, kSwitch: the old flag ("--transport", "--tf32")
  std::string flag;       // the flag to write instead ("--dist"); kValue: the flag whose value
  std::string old_value;  // kValue: the old value ("f16"), also as an item of a comma list
  std::string value;      // kValue: its new spelling ("fp16"); kSwitch: the value it stands for
};

// `old_flag VALUE` is now `flag VALUE` (the flag takes a value).
OldSpelling renamed_flag(std::string old_flag, std::string flag);
// The switch `old_flag` (no value) is now `flag value` (--tf32 -> --precision tf32).
OldSpelling switch_to_value(std::string old_flag, std::string flag, std::string value);
// `flag old_value` is now `flag value`; in a comma list each item is renamed.
OldSpelling renamed_value(std::string flag, std::string old_value, std::string value);

// argv with every old spelling rewritten (argv[0] kept; "--flag=value" and "--flag value" both;
// nothing after "--"), and for each rewrite one line on stderr, unless `quiet`:
// "<app>: <old words> is deprecated: write <new words>".
std::vector<std::string> rewrite_old_spellings(int argc, const char* const* argv,
                                               const std::vector<OldSpelling>& old_spellings,
                                               const char* app_name, bool quiet);

}  // namespace kiln::apps
