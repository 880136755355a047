// flag_names.cpp: see flag_names.h.
#include "apps/common/flag_names.h"

#include <cstddef>
#include <iostream>
#include <optional>
#include <utility>

namespace kiln::apps {

OldSpelling renamed_flag(std::string old_flag, std::string flag) {
  return {OldSpelling::Kind::kFlag, std::move(old_flag), std::move(flag), "", ""};
}

OldSpelling switch_to_value(std::string old_flag, std::string flag, std::string value) {
  return {OldSpelling::Kind::kSwitch, std::move(old_flag), std::move(flag), "", std::move(value)};
}

OldSpelling renamed_value(std::string flag, std::string old_value, std::string value) {
  return {OldSpelling::Kind::kValue, "", std::move(flag), std::move(old_value), std::move(value)};
}

namespace {

// `value` with every item of its comma list that has an old spelling for `flag` renamed.
std::string rename_values(const std::string& flag, const std::string& value,
                          const std::vector<OldSpelling>& old_spellings) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t comma = value.find(',', start);
    std::string item = value.substr(start, comma == std::string::npos ? std::string::npos
                                                                      : comma - start);
    for (const OldSpelling& s : old_spellings) {
      if (s.kind == OldSpelling::Kind::kValue && s.flag == flag && s.old_value == item) {
        item = s.value;
        break;
      }
    }
    out += item;
    if (comma == std::string::npos) break;
    out += ',';
    start = comma + 1;
  }
  return out;
}

bool has_value_renames(const std::string& flag, const std::vector<OldSpelling>& old_spellings) {
  for (const OldSpelling& s : old_spellings) {
    if (s.kind == OldSpelling::Kind::kValue && s.flag == flag) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> rewrite_old_spellings(int argc, const char* const* argv,
                                               const std::vector<OldSpelling>& old_spellings,
                                               const char* app_name, bool quiet) {
  std::vector<std::string> out;
  if (argc > 0) out.emplace_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string token = argv[i];
    if (token == "--") {  // the rest are positional arguments
      for (; i < argc; ++i) out.emplace_back(argv[i]);
      break;
    }
    // "--name=value" or "--name" (its value, if it takes one, is the next word).
    const size_t eq = token.rfind("--", 0) == 0 ? token.find('=') : std::string::npos;
    const std::string name = token.substr(0, eq);
    std::optional<std::string> inline_value;
    if (eq != std::string::npos) inline_value = token.substr(eq + 1);

    const OldSpelling* rename = nullptr;
    for (const OldSpelling& s : old_spellings) {
      if (s.kind != OldSpelling::Kind::kValue && s.old_flag == name) rename = &s;
    }
    const std::string flag = rename != nullptr ? rename->flag : name;
    const bool switch_rename = rename != nullptr && rename->kind == OldSpelling::Kind::kSwitch;
    const bool takes_value =
        !switch_rename && (rename != nullptr || has_value_renames(flag, old_spellings));
    if (!takes_value && !switch_rename) {
      out.push_back(token);
      continue;
    }

    std::string old_words = token;
    std::optional<std::string> value = inline_value;
    if (switch_rename) {
      value = rename->value;
    } else if (!value && i + 1 < argc) {
      value = argv[++i];
      old_words += std::string(" ") + *value;
    }
    if (value && !switch_rename) value = rename_values(flag, *value, old_spellings);

    std::string new_words;
    if (!value) {
      out.push_back(flag);  // no value given: CLI11 says so, under the new name
      new_words = flag;
    } else if (inline_value) {
      out.push_back(flag + "=" + *value);
      new_words = out.back();
    } else {
      out.push_back(flag);
      out.push_back(*value);
      new_words = flag + " " + *value;
    }
    if (new_words != old_words && !quiet) {
      std::cout.flush();
      std::cerr << app_name << ": " << old_words << " is deprecated: write " << new_words << "\n";
    }
  }
  return out;
}

}  // namespace kiln::apps
