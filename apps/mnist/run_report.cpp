// run_report.cpp: see run_report.h.
#include "apps/mnist/run_report.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "apps/common/flag_checks.h"  // human_bytes
#include "apps/common/mixed_precision.h"
#include "apps/common/progress.h"
#include "apps/mnist/device.h"
#include "apps/mnist/flags.h"
#include "apps/mnist/schedule.h"
#include "engine/allocator.h"
#include "engine/build_config.h"
#include "engine/error.h"
#include "engine/output_file.h"
#include "engine/step_graph.h"
#if KILN_WITH_CUDA
#include "engine/cuda/caching_allocator.h"
#endif

namespace kiln::apps::mnist {

namespace {

std::string format_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Tensor memory of the training device (the caching allocator's high-water mark).
MemoryStats device_memory_stats(Device device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) return cuda_allocator::stats(device.index);
#endif
  return cpu_allocator::stats();
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

// "data parallel: local:3, 3 ranks (2 workers, 1 server), allreduce ps, buckets 1 MiB, batch
// 64 per worker = 128 global".
void print_data_parallel_line(const Options& o, const RunPlan& plan) {
  const RankLayout& ranks = plan.ranks;
  std::string how = "allreduce " + o.allreduce + ", buckets " + format_g(o.bucket_mb) +
                    " MiB" + (o.fp16_allreduce   ? ", fp16 on the wire"
                              : o.bf16_allreduce ? ", bf16 on the wire"
                                                 : "");
  if (o.ps_async) {
    how = "asynchronous parameter server, staleness " + std::to_string(o.ps_staleness);
  }
  std::string who = count_of(ranks.workers, "worker");
  if (ranks.servers > 0) who += ", " + count_of(ranks.servers, "server");
  std::string lr;
  if (o.batch_per_rank) {
    lr = ", lr x" + std::to_string(ranks.workers) + " after " +
         std::to_string(plan.warmup_steps) + " warm-up steps";
  }
  std::printf("data parallel: %s, %s (%s), %s, batch %lld per worker = %lld global%s\n",
              o.dist.c_str(), count_of(ranks.world, "rank").c_str(), who.c_str(), how.c_str(),
              static_cast<long long>(plan.rank_batch), static_cast<long long>(plan.global_batch),
              lr.c_str());
}

// The fields of data parallelism (world_size 1 and zeros for --dist none).
void add_data_parallel_fields(const Options& o, const RunPlan& plan, const CommSummary& traffic,
                              bool replicas_equal, nlohmann::json& j) {
  j["dist"] = o.dist;
  j["world_size"] = plan.ranks.world;
  j["worker_ranks"] = plan.ranks.workers;
  j["allreduce"] = plan.ranks.dist ? o.allreduce : "none";
  j["ps_servers"] = plan.ranks.servers;
  j["ps_async"] = o.ps_async;
  j["ps_staleness"] = o.ps_async ? o.ps_staleness : 0;
  j["bucket_mb"] = o.bucket_mb;
  j["fp16_allreduce"] = o.fp16_allreduce;
  j["bf16_allreduce"] = o.bf16_allreduce;
  j["batch_per_rank"] = o.batch_per_rank;
  j["rank_batch_size"] = plan.rank_batch;
  j["global_batch_size"] = plan.global_batch;
  j["warmup_steps"] = o.batch_per_rank ? plan.warmup_steps : 0;
  // Gradient communication of rank 0: the allreduces' time on the communicator's thread, the
  // part of it backward did not hide, and the bytes this rank sent (async: pushes and pulls).
  j["comm_seconds"] = traffic.comm_seconds;
  j["exposed_comm_seconds"] = traffic.exposed_seconds;
  j["overlap_fraction"] = traffic.overlap_fraction;
  j["bytes_sent_per_rank"] = traffic.bytes_sent;
  j["buckets"] = traffic.buckets;
  j["replicas_equal"] = replicas_equal;
}

}  // namespace

namespace {

// "bf16", or for resnet18 "bf16, channels_last, 16bit activations".
std::string precision_description(const Options& o) {
  if (o.model != "resnet18") return o.precision;
  std::string s = o.precision + ", " + o.memory_format;
  if (o.precision == "bf16" || o.precision == "fp16") s += ", " + activations_of(o) + " activations";
  return s;
}

}  // namespace

void print_run_header(const Options& o, const RunPlan& plan, const Module& model,
                      const Datasets& data) {
  const Device device = plan.device;
  std::printf("mnist_train: %s (%lld parameters) on %s, %s%s, %s kernels, %s, %s lr %g "
              "(%s), batch %lld, %lld train / %lld test images, seed %llu\n",
              o.model.c_str(), static_cast<long long>(model.num_parameters()),
              (device.str() + (cuda::kSimulated && device.is_cuda() ? " (SIMULATED)" : "")).c_str(),
              count_of(o.threads, "thread").c_str(), plan.ranks.dist ? " per rank" : "", impl_name(impl_for(device)),
              precision_description(o).c_str(),
              o.optimizer.c_str(),
              o.lr, describe_schedule(o).c_str(), static_cast<long long>(o.batch_size),
              static_cast<long long>(data.train->size()), static_cast<long long>(data.test->size()),
              static_cast<unsigned long long>(o.seed));
  if (o.data_on_device) {
    // Both sets' bytes: 784 pixels and a label per example.
    const double bytes = static_cast<double>(data.train->size() + data.test->size()) * (784 + 1);
    std::printf("data: %s; on the device: %s of bytes, each batch gathered there by a "
                "kernel\n", data.train->describe().c_str(), human_bytes(bytes).c_str());
  } else {
    std::printf("data: %s; loader: %s, prefetch %d%s\n", data.train->describe().c_str(),
                count_of(o.workers, "worker").c_str(), o.prefetch,
                o.pin_memory || device.is_cuda() ? ", pinned" : "");
  }
  if (device.is_cuda() && !plan.ranks.dist) {
    if (o.cuda_graph) {
      std::printf("step: one CUDA graph (%d eager steps, a capture, then a replay per step; an "
                  "epoch's smaller last batch eager)\n", StepGraphOptions().warmup_steps);
    } else {
      std::printf("step: eager (--cuda-graph replays it as one CUDA graph)\n");
    }
  }
  if (plan.ranks.dist) print_data_parallel_line(o, plan);
  if (plan.start_position > 0) {
    std::printf("resumed from %s in epoch %d, after %lld of its %lld examples\n",
                o.resume.c_str(), plan.start_epoch + 1,
                static_cast<long long>(plan.start_position),
                static_cast<long long>(data.train->size()));
  } else if (plan.start_epoch > 0) {
    std::printf("resumed from %s after epoch %d\n", o.resume.c_str(), plan.start_epoch);
  }
  std::fflush(stdout);
}

void print_epoch_line(const Options& o, int epoch, const EpochResult& r, double epoch_seconds,
                      const std::string& rate) {
  std::printf("epoch %2d/%d  train loss %.4f  test loss %.4f  test acc %.2f%%  %.0f img/s  "
              "%.1f s (train %.1f s, eval %.1f s)%s\n",
              epoch + 1, o.epochs, r.train_loss, r.test_loss, 100.0 * r.test_accuracy,
              r.images_per_sec, epoch_seconds, r.train_seconds, r.eval_seconds, rate.c_str());
  std::fflush(stdout);
}

nlohmann::json summary_json(const Options& o, const RunPlan& plan, const Datasets& data,
                            const std::vector<EpochResult>& results,
                            const std::vector<apps::EpochRecord>& history,
                            const CommSummary& traffic, bool replicas_equal,
                            const GradScaler* scaler, int64_t graph_replays) {
  nlohmann::json j;
  j["precision"] = o.precision;
  j["memory_format"] = o.memory_format;
  // What flowed between the layers: 16-bit only under a 16-bit autocast.
  j["activations"] = o.precision == "bf16" || o.precision == "fp16" ? activations_of(o) : "f32";
  if (scaler != nullptr) j["loss_scale"] = loss_scale_json(*scaler);
  std::vector<double> acc, loss, test_loss, ips, secs;
  std::vector<int64_t> examples;
  double train_total = 0, wait_total = 0;
  for (const EpochResult& r : results) {
    examples.push_back(r.train_seen);
    acc.push_back(r.test_accuracy);
    loss.push_back(r.train_loss);
    test_loss.push_back(r.test_loss);
    ips.push_back(r.images_per_sec);
    secs.push_back(r.train_seconds + r.eval_seconds);
    train_total += r.train_seconds;
    wait_total += r.wait_seconds;
  }
  const Device device = plan.device;
  j["device"] = device.str();
  j["model"] = o.model;
  j["optimizer"] = o.optimizer;
  j["lr"] = o.lr;
  j["gamma"] = o.gamma;
  j["lr_schedule"] = schedule_json(o);
  j["recipe"] = o.recipe;
  j["epochs"] = o.epochs;
  j["start_epoch"] = plan.start_epoch;
  j["start_position"] = plan.start_position;
  j["batch_size"] = o.batch_size;
  j["eval_batch_size"] = o.eval_batch_size;
  j["threads"] = o.threads;
  j["kernels"] = impl_name(impl_for(device));
  j["train_images"] = data.train->size();
  j["test_images"] = data.test->size();
  j["test_accuracy"] = acc.empty() ? 0.0 : acc.back();
  j["test_accuracy_per_epoch"] = acc;
  j["train_loss_per_epoch"] = loss;
  j["test_loss"] = test_loss.empty() ? 0.0 : test_loss.back();
  j["test_loss_per_epoch"] = test_loss;
  // The whole run, epoch by epoch (epoch 1-based, as the printed lines), the epochs before a
  // --resume included (their records come from the checkpoint: apps/common/train_checkpoint.h).
  nlohmann::json run_history = nlohmann::json::array();
  for (const apps::EpochRecord& e : history) {
    run_history.push_back({{"epoch", e.epoch + 1}, {"train_loss", e.train_loss},
                           {"test_loss", e.test_loss}, {"test_accuracy", e.test_accuracy},
                           {"seconds", e.seconds}});
  }
  j["history"] = run_history;
  // Examples each epoch trained on, all workers, a resumed epoch's earlier part included (a
  // DistributedSampler's padding makes it up to ranks - 1 more than train_images).
  j["train_examples_per_epoch"] = examples;
  j["train_images_per_sec"] = median(ips);
  j["train_images_per_sec_per_epoch"] = ips;
  j["epoch_seconds"] = secs;
  // Seconds of the training loops alone (evaluation excluded), per epoch and in all.
  std::vector<double> train_secs;
  for (const EpochResult& r : results) train_secs.push_back(r.train_seconds);
  j["train_seconds_per_epoch"] = train_secs;
  j["train_seconds"] = train_total;
  // Tensor memory of the training device (the caching allocator's high-water mark).
  const MemoryStats mem = device_memory_stats(device);
  j["peak_memory_bytes"] = mem.peak_bytes;
  j["reserved_memory_bytes"] = mem.reserved_bytes;
  j["peak_rss_bytes"] = peak_rss_bytes();
  // Of the training loop's time, the fraction next() spent waiting for (or, with 0 workers,
  // building) batches: near 0 when the loader keeps up.
  j["loader_wait_fraction"] = train_total > 0 ? wait_total / train_total : 0.0;
  j["workers"] = o.workers;
  j["prefetch"] = o.prefetch;
  j["pin_memory"] = o.pin_memory;
  j["format"] = o.format;
  j["data_on_device"] = o.data_on_device;
  j["cuda_graph"] = o.cuda_graph;
  j["cuda_graph_replays"] = graph_replays;  // steps replayed from the graph (not eager)
  j["seed"] = o.seed;
  j["simulated"] = cuda::kSimulated && device.is_cuda();
  add_data_parallel_fields(o, plan, traffic, replicas_equal, j);
  return j;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  write_output_file("--json", path, j.dump(2) + "\n");
}

void print_closing_lines(const Options& o, const RunPlan& plan,
                         const std::vector<EpochResult>& results, const CommSummary& traffic) {
  std::vector<double> ips;
  for (const EpochResult& r : results) ips.push_back(r.images_per_sec);
  const double final_acc = results.empty() ? 0.0 : results.back().test_accuracy;
  std::printf("test accuracy %.2f%% after %s; median %.0f img/s; peak RSS %.0f MB, "
              "tensors %.0f MB\n", 100.0 * final_acc, count_of(o.epochs, "epoch").c_str(), median(ips),
              peak_rss_bytes() / 1e6, device_memory_stats(plan.device).peak_bytes / 1e6);
  if (o.recipe != "default") {
    double train_seconds = 0;
    for (const EpochResult& r : results) train_seconds += r.train_seconds;
    std::printf("recipe %s: %.1f s of training (evaluation excluded) over %s\n",
                o.recipe.c_str(), train_seconds,
                count_of(static_cast<long long>(results.size()), "epoch").c_str());
  }
  if (plan.ranks.dist && !o.ps_async) {
    std::printf("communication: %.2f s of allreduce, %.0f%% hidden behind backward, %.1f MB "
                "sent by rank 0\n", traffic.comm_seconds, 100.0 * traffic.overlap_fraction,
                static_cast<double>(traffic.bytes_sent) / 1e6);
  }
}

}  // namespace kiln::apps::mnist
