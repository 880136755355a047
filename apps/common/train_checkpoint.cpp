// train_checkpoint.cpp: see train_checkpoint.h.
#include "apps/common/train_checkpoint.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

#include "engine/error.h"
#include "engine/philox.h"

namespace kiln::apps {

namespace {

constexpr const char* kFormat = "kiln-train/2";
constexpr const char* kFormatEpochEnds = "kiln-train/1";  // before mid-epoch checkpoints
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kScalerPrefix = "scaler.";

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error("checkpoint '" + path + "': " + what, ErrorKind::Input);
}

std::string format_double(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

const std::string& meta_value(const Checkpoint& c, const std::string& path, const std::string& key) {
  auto it = c.meta.find(key);
  if (it == c.meta.end()) bad(path, "has no '" + key + "' entry: it was not written by a Kiln training app");
  return it->second;
}

uint64_t meta_u64(const Checkpoint& c, const std::string& path, const std::string& key) {
  const std::string& s = meta_value(c, path, key);
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno != 0)
    bad(path, "entry '" + key + "' is not an unsigned integer: '" + s + "'");
  return v;
}

// A count or position kept as int64_t (epochs, steps, workers): a value past INT64_MAX would
// turn negative.
int64_t meta_count(const Checkpoint& c, const std::string& path, const std::string& key) {
  const uint64_t v = meta_u64(c, path, key);
  if (v > static_cast<uint64_t>(INT64_MAX))
    bad(path, "entry '" + key + "' is " + std::to_string(v) + ", out of range: the file is damaged");
  return static_cast<int64_t>(v);
}

double meta_double(const Checkpoint& c, const std::string& path, const std::string& key) {
  const std::string& s = meta_value(c, path, key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') bad(path, "entry '" + key + "' is not a number: '" + s + "'");
  return v;
}

// "history" and "history_seconds" (train_checkpoint.h): records separated by ';', fields by ','.
std::string history_text(const std::vector<EpochRecord>& history) {
  std::string s;
  for (const EpochRecord& e : history) {
    if (!s.empty()) s += ';';
    s += std::to_string(e.epoch) + "," + format_double(e.train_loss) + "," +
         format_double(e.test_loss) + "," + format_double(e.test_accuracy);
  }
  return s;
}

std::string history_seconds_text(const std::vector<EpochRecord>& history) {
  std::string s;
  for (const EpochRecord& e : history) s += (s.empty() ? "" : ";") + format_double(e.seconds);
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (s.back() == sep) out.emplace_back();
  return out;
}

double history_number(const std::string& path, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') bad(path, "entry 'history' holds '" + text + "', not a number: the file is damaged");
  return v;
}

// An older file has no history: an empty one.
std::vector<EpochRecord> read_history(const Checkpoint& c, const std::string& path) {
  std::vector<EpochRecord> history;
  const auto h = c.meta.find("history");
  if (h == c.meta.end()) return history;
  for (const std::string& record : split(h->second, ';')) {
    const std::vector<std::string> f = split(record, ',');
    if (f.size() != 4) bad(path, "entry 'history' has a record of " + std::to_string(f.size()) +
                                     " fields, not 4: the file is damaged");
    EpochRecord e;
    e.epoch = static_cast<int64_t>(history_number(path, f[0]));
    e.train_loss = history_number(path, f[1]);
    e.test_loss = history_number(path, f[2]);
    e.test_accuracy = history_number(path, f[3]);
    history.push_back(e);
  }
  const auto secs = c.meta.find("history_seconds");
  if (secs != c.meta.end()) {
    const std::vector<std::string> s = split(secs->second, ';');
    for (size_t i = 0; i < s.size() && i < history.size(); ++i) {
      history[i].seconds = history_number(path, s[i]);
    }
  }
  return history;
}

// The entries of `tensors` whose name starts with `prefix`, with the prefix removed.
std::map<std::string, Tensor> with_prefix_removed(const std::map<std::string, Tensor>& tensors,
                                                  const std::string& prefix) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) out.emplace(name.substr(prefix.size()), t);
  return out;
}

}  // namespace

void write_train_checkpoint(const std::string& path, const Module& model, const Optimizer& opt,
                            const TrainCheckpoint& meta, const GradScaler* scaler) {
  KILN_CHECK(meta.epoch >= 0 && meta.epoch_position >= 0 && meta.global_step >= 0 &&
                 meta.epoch_steps >= 0 && meta.epoch_seen >= 0 && meta.workers >= 1,
             "write_train_checkpoint: a negative position or count for ", path);
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : model.state_dict()) tensors.emplace(kModelPrefix + name, t);
  for (const auto& [name, t] : opt.state_dict()) tensors.emplace(kOptimizerPrefix + name, t);
  if (scaler != nullptr)
    for (const auto& [name, t] : scaler->state_dict()) tensors.emplace(kScalerPrefix + name, t);
  const std::map<std::string, std::string> m = {
      {"format", kFormat},
      {"epoch", std::to_string(meta.epoch)},
      {"epoch_position", std::to_string(meta.epoch_position)},
      {"global_step", std::to_string(meta.global_step)},
      {"epoch_steps", std::to_string(meta.epoch_steps)},
      {"epoch_loss_sum", format_double(meta.epoch_loss_sum)},
      {"epoch_seen", std::to_string(meta.epoch_seen)},
      {"workers", std::to_string(meta.workers)},
      {"train_examples", std::to_string(meta.train_examples)},
      {"model", meta.model},
      {"optimizer", meta.optimizer},
      {"seed", std::to_string(meta.seed)},
      {"generator_offset", std::to_string(meta.generator_offset)},
      {"lr", format_double(meta.lr)},
      {"test_accuracy", format_double(meta.test_accuracy)},
      {"history", history_text(meta.history)},
      {"history_seconds", history_seconds_text(meta.history)},
  };
  write_checkpoint(path, tensors, m);
}

TrainCheckpoint read_train_checkpoint(const std::string& path, const std::string& expected_model,
                                      const std::string& expected_optimizer) {
  TrainCheckpoint c;
  c.file = read_checkpoint(path);  // validates magic, version, sizes and CRCs; names the file
  const std::string& format = meta_value(c.file, path, "format");
  if (format != kFormat && format != kFormatEpochEnds) {
    bad(path, "has format '" + format + "', expected '" + kFormat + "' (or '" + kFormatEpochEnds +
                  "'): it was written by another Kiln; resume it with that one");
  }
  c.epoch = meta_count(c.file, path, "epoch");
  if (format == kFormat) {
    c.epoch_position = meta_count(c.file, path, "epoch_position");
    c.global_step = meta_count(c.file, path, "global_step");
    c.epoch_steps = meta_count(c.file, path, "epoch_steps");
    c.epoch_loss_sum = meta_double(c.file, path, "epoch_loss_sum");
    c.epoch_seen = meta_count(c.file, path, "epoch_seen");
    c.workers = meta_count(c.file, path, "workers");
    if (c.workers < 1) bad(path, "entry 'workers' is 0: the file is damaged");
    // Files written before the entry have none; "-1": not known to the writer.
    if (c.file.meta.count("train_examples") != 0 && c.file.meta.at("train_examples") != "-1") {
      c.train_examples = meta_count(c.file, path, "train_examples");
    }
  }
  c.model = meta_value(c.file, path, "model");
  c.optimizer = meta_value(c.file, path, "optimizer");
  c.seed = meta_u64(c.file, path, "seed");
  c.generator_offset = meta_u64(c.file, path, "generator_offset");
  c.lr = meta_double(c.file, path, "lr");
  c.test_accuracy = meta_double(c.file, path, "test_accuracy");
  c.history = read_history(c.file, path);
  if (c.model != expected_model) {
    bad(path, "holds a '" + c.model + "' model but --model is '" + expected_model +
                  "': pass --model " + c.model + " to resume it");
  }
  if (c.optimizer != expected_optimizer) {
    bad(path, "was trained with --optimizer " + c.optimizer + ", not " + expected_optimizer +
                  ": pass --optimizer " + c.optimizer + " to resume it");
  }
  return c;
}

void check_checkpoint_fits_dataset(const TrainCheckpoint& ckpt, const std::string& path,
                                   int64_t train_examples) {
  if (ckpt.epoch_position == 0) return;  // at an epoch's end: nothing depends on the set
  const std::string where = "was written " + std::to_string(ckpt.epoch_position) +
                            " images into epoch " + std::to_string(ckpt.epoch + 1);
  const std::string todo = ": resume it with the training set it was written for (the same "
                           "--data and --limit-train), or start a new run without --resume";
  if (ckpt.train_examples >= 0 && ckpt.train_examples != train_examples) {
    bad(path, where + " over a training set of " + std::to_string(ckpt.train_examples) +
                  " images, and this one has " + std::to_string(train_examples) +
                  " (a position in one set's order means nothing in another's)" + todo);
  }
  if (ckpt.epoch_position > train_examples) {
    bad(path, where + ", past the " + std::to_string(train_examples) +
                  " images of this training set" + todo);
  }
}

void restore_train_checkpoint(const TrainCheckpoint& ckpt, const std::string& path,
                              Module& model, Optimizer& opt, GradScaler* scaler) {
  const std::map<std::string, Tensor> scaler_state =
      with_prefix_removed(ckpt.file.tensors, kScalerPrefix);
  if (scaler == nullptr && !scaler_state.empty())
    bad(path, "was trained with --precision fp16 (it holds the loss scaler's state): pass "
              "--precision fp16 to resume it");
  if (scaler != nullptr && scaler_state.empty())
    bad(path, "was not trained with --precision fp16 (it has no loss scaler state): resume it "
              "with the precision it was trained with");
  try {
    model.load_state_dict(with_prefix_removed(ckpt.file.tensors, kModelPrefix));
    opt.load_state_dict(with_prefix_removed(ckpt.file.tensors, kOptimizerPrefix));
    if (scaler != nullptr) scaler->load_state_dict(scaler_state);
  } catch (const Error& e) {
    bad(path, std::string("does not fit this model/optimizer: ") + e.what());
  }
  default_generator().set_state(ckpt.seed, ckpt.generator_offset);
}

}  // namespace kiln::apps
