// env_switch.h: an on/off switch read from the environment (KILN_TF32, KILN_GEMM_SM90).
#pragma once

namespace kiln {

// The switch `name`: unset or empty gives default_on, "1" true, "0" false. Any other value is a
// kiln::Error (ErrorKind::Usage) naming the variable and the value and saying what 1 and 0 do:
// `on_means` and `off_means`, e.g. "allow TF32 tensor cores in FP32 products".
bool env_switch(const char* name, bool default_on, const char* on_means, const char* off_means);

}  // namespace kiln
