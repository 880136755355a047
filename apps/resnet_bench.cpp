// resnet_bench: one device vs naive model parallelism vs pipelined micro-batches, for a ResNet
// split over two (or more) devices; the split-size sweep; the measured pipeline bubble and
// activation memory per stage; hybrid data x pipeline parallelism (--dp N, or under mpirun).
//
// It reproduces PyTorch's "Single-Machine Model Parallel Best Practices" tutorial
// (https://pytorch.org/tutorials/intermediate/model_parallel_tutorial.html) with Kiln's
// pipeline (models/pipeline/pipeline.h); docs/model_parallel.md walks through the results.
//
//   resnet_bench                                    # defaults: about 6 minutes on 2 cores
//   resnet_bench --image-size 128 --repeats 10 --steps 3 --balance tutorial  # the tutorial's run
//   resnet_bench --devices cuda:0,cuda:1 --schedule 1f1b
//   resnet_bench --modes pipeline --schedule gpipe,1f1b,zb-h1,zb-h2,interleaved --chunks 2
//   resnet_bench --dp 2 --modes pipeline --split-sizes 8            # 2 replicas x 2 stages
//   mpirun -np 2 resnet_bench --modes pipeline --split-sizes 8       # one pipeline per process
//
// Timing: every setup is built first (a fresh model from the same seed each) and warmed up by
// one step; then each repeat times --steps steps of every setup in turn, so all setups see the
// same machine noise (with several --schedule, each split size runs every schedule in turn). A
// repeat's figure is its mean step time; printed: mean +- std over the repeats, images/s and
// the speedup over the single-device setup. --refine-cut (the default for --balance time) then
// times each schedule's fastest split again at its cut and the neighbouring cuts, and traces
// the fastest (apps/resnet_bench/refine.h: why block times measured alone mislead).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "apps/common/csv_out.h"
#include "apps/common/flag_checks.h"
#include "apps/common/launcher.h"
#include "apps/common/rank_agreement.h"
#include "apps/common/mixed_precision.h"
#include "apps/common/output_paths.h"
#include "apps/common/progress.h"
#include "apps/common/step_flops.h"
#include "apps/resnet_bench/pipeline_report.h"
#include "apps/resnet_bench/plan.h"
#include "apps/resnet_bench/refine.h"
#include "apps/resnet_bench/runs.h"
#include "apps/resnet_bench/schedules.h"
#include "comm/local_transport.h"
#include "comm/mpi_transport.h"
#include "engine/allocator.h"
#include "engine/cuda/context.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"
#include "engine/output_file.h"
#include "engine/parallel.h"
#include "engine/trace.h"

namespace kiln::apps {
namespace {

struct Options {
  Workload workload;
  std::string modes = "single,model-parallel,pipeline";
  std::string devices;  // default: cuda:0,cuda:1 when two GPUs exist, else cpu:0,cpu:1
  std::string schedule = "gpipe";  // a comma list (apps/resnet_bench/schedules.h)
  int chunks = 2;                  // model chunks per device of the interleaved schedule
  bool recompute = false;
  bool cuda_graph = false;  // single mode on a GPU: also the step as one CUDA graph
  std::string split_sizes = "1,3,5,8,10,12,20,40,60";
  std::string balance = "time";
  // --refine-cut / --no-refine-cut (neither given: on for --balance time, refine.h).
  bool refine_cut = false, no_refine_cut = false;
  int steps = 2, repeats = 3, threads_per_stage = 0, dp = 1;
  std::string csv, json, trace;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int64_t> parse_split_sizes(const std::string& s, int64_t batch) {
  std::vector<int64_t> sizes;
  for (const std::string& item : split_list(s)) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    KILN_CHECK_INPUT(end && *end == '\0' && v >= 1 && v <= batch, "--split-sizes: each must be "
                     "a number of rows between 1 and --batch-size ", batch, " (got ", item, ")");
    sizes.push_back(v);
  }
  KILN_CHECK_INPUT(!sizes.empty(), "--split-sizes: give at least one size, e.g. 4,8,12");
  return sizes;
}

std::vector<Device> parse_devices(const std::string& spec) {
  std::vector<Device> devices;
  for (const std::string& item : split_list(spec)) {
    Device d = parse_device(item);
    if (d.is_cuda()) {
      KILN_CHECK_INPUT(cuda::is_available(), "--devices ", item, ": ", cuda::unavailable_reason(),
                       " (e.g. --devices cpu:0,cpu:1)");
#if KILN_WITH_CUDA
      cuda::check_device(d.index);
#endif
    }
    devices.push_back(d);
  }
  KILN_CHECK_INPUT(devices.size() >= 2, "--devices: model parallelism needs at least two "
                   "devices, e.g. cpu:0,cpu:1 or cuda:0,cuda:1");
  return devices;
}

// --refine-cut keeps a neighbouring cut only when its step is more than this much faster than
// the time-balanced cut's (smaller differences are the noise of two steps).
constexpr double kRefineMinGain = 0.01;

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

bool any_cuda(const std::vector<Device>& devices) {
  return std::any_of(devices.begin(), devices.end(), [](Device d) { return d.is_cuda(); });
}

// The time of `steps` steps of `run`, per step: from the end of the work queued before (the
// warm-up, another setup's steps) to the end of the steps' own work. Only finish() waits for
// the device, not each step.
double time_steps(Run& run, const Batch& batch, int steps) {
  run.finish();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) run.step(batch);
  run.finish();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

// What the MPI processes of a hybrid run must share: a process started with another model,
// batch or number of steps would send messages no other process receives (a hang).
std::vector<comm::Setting> flags_every_rank_shares(const Options& o, int stages) {
  const Workload& w = o.workload;
  return {{"--model", w.model}, {"--image-size", std::to_string(w.image)},
          {"--batch-size", std::to_string(w.batch)}, {"--classes", std::to_string(w.classes)},
          {"--width", std::to_string(w.width)}, {"--lr", detail::str(w.lr)},
          {"--precision", w.precision}, {"--memory-format", memory_format_name(w.memory_format)},
          {"--activations", w.activations_flag},
          {"--modes", o.modes},
          {"stages (--devices)", std::to_string(stages)}, {"--schedule", o.schedule},
          {"--chunks", std::to_string(o.chunks)},
          {"--recompute", o.recompute ? "yes" : "no"}, {"--split-sizes", o.split_sizes},
          {"--balance", o.balance}, {"--steps", std::to_string(o.steps)},
          {"--repeats", std::to_string(o.repeats)}};
}

// Hybrid data x pipeline parallelism: N replicas of the pipeline, each stage averaging its
// gradients with the same stage of the other replicas. Local threads (--dp N) or MPI processes.
int run_hybrid(const Options& o, const std::vector<Device>& devices, int threads_per_stage,
               const SweepSchedule& schedule) {
  const bool mpi = launched_by_mpi();
  const int p = static_cast<int>(devices.size());
  std::vector<int64_t> sizes = parse_split_sizes(o.split_sizes, o.workload.batch);
  const int64_t split = sizes.front();
  Plan plan = make_plan(o.workload, o.balance, devices,
                        profile_blocks(o.workload, devices, threads_per_stage, split),
                        schedule.pieces(p));
  std::printf("\nstage plan at the split size (--balance %s):\n%s", o.balance.c_str(),
              plan.text.c_str());
  struct ReplicaResult {
    std::vector<double> step_s;
    std::vector<double> overlap;
    double checksum = 0;
    std::string error;
  };
  auto replica_body = [&](int r, int replicas, std::vector<std::shared_ptr<comm::Transport>> ts,
                          std::vector<Device> devs, int threads, ReplicaResult& out) {
    Workload w = o.workload;
    w.batch = o.workload.batch / replicas;
    PipelineOptions po =
        pipeline_options(schedule.schedule, schedule.chunks, split, o.recompute, threads);
    po.stage_transports = std::move(ts);
    po.replica = r;
    PipelineRun run(w, plan.partition, devs, po);
    // Each replica its shard.
    const Batch batch = for_devices(random_batch(w, 100 + static_cast<uint64_t>(r)), devs);
    run.step(batch);  // warm-up (and the stages' parameter broadcasts)
    for (int rep = 0; rep < o.repeats; ++rep) out.step_s.push_back(time_steps(run, batch, o.steps));
    out.overlap = run.pipeline().last_step().overlap_fraction;
    cuda::AllowSync allow("resnet_bench: the replicas' parameters are compared once, at the end");
    for (int s = 0; s < p; ++s) {
      for (const Tensor& t : run.pipeline().stage_parameters(s)) {
        for (float v : t.to(Device("cpu")).to_vector<float>()) out.checksum += v;
      }
    }
  };
  int replicas = o.dp, rank = 0;
  std::vector<ReplicaResult> results;
  if (mpi) {
    std::vector<std::shared_ptr<comm::Transport>> ts;
    for (int s = 0; s < p; ++s) ts.push_back(comm::make_mpi_transport());
    // Before any other message: processes started with other flags would hang.
    if (const int rc = refuse_unless_ranks_agree("resnet_bench", *ts[0],
                                                 flags_every_rank_shares(o, p))) {
      return rc;
    }
    replicas = ts[0]->size();
    rank = ts[0]->rank();
    {
      // Every process must cut the model the same way: rank 0's measured partition wins.
      comm::Communicator c(ts[0]);
      std::vector<double> bounds(plan.partition.bounds.begin(), plan.partition.bounds.end());
      Tensor t = Tensor::from_vector(bounds, {static_cast<int64_t>(bounds.size())});
      c.broadcast(t, 0);
      std::vector<double> agreed = t.to_vector<double>();
      plan.partition.bounds.assign(agreed.begin(), agreed.end());
    }
    KILN_CHECK_INPUT(o.workload.batch % replicas == 0, "--batch-size ", o.workload.batch,
                     " must divide among the ", replicas, " ranks");
    const int local = std::max(1, ts[0]->local_size());
    const int threads = o.threads_per_stage > 0 ? o.threads_per_stage
                                                : std::max(1, hardware_threads() / (local * p));
    results.resize(1);
    replica_body(rank, replicas, ts, devices, threads, results[0]);
  } else {
    KILN_CHECK_INPUT(o.workload.batch % replicas == 0, "--batch-size ", o.workload.batch,
                     " must divide among the ", replicas, " replicas of --dp");
    std::vector<std::vector<std::shared_ptr<comm::Transport>>> groups;
    for (int s = 0; s < p; ++s) groups.push_back(comm::make_local_group(replicas));
    const int threads = o.threads_per_stage > 0
                            ? o.threads_per_stage
                            : std::max(1, hardware_threads() / (replicas * p));
    results.resize(replicas);
    std::vector<std::thread> threads_of_replicas;
    for (int r = 0; r < replicas; ++r) {
      threads_of_replicas.emplace_back([&, r] {
        try {
          std::vector<std::shared_ptr<comm::Transport>> ts;
          std::vector<Device> devs;
          for (int s = 0; s < p; ++s) {
            ts.push_back(groups[s][r]);
            // CPU replicas get their own cpu:N places; GPUs are shared round robin.
            Device d = devices[s];
            devs.push_back(d.is_cpu() ? Device(DeviceType::CPU, r * p + s)
                                      : Device(DeviceType::CUDA, (d.index + r * p) %
                                                                      std::max(1, cuda::device_count())));
          }
          replica_body(r, replicas, ts, devs, threads, results[r]);
        } catch (const std::exception& e) {
          results[r].error = e.what();
        }
      });
    }
    for (auto& t : threads_of_replicas) t.join();
    for (int r = 0; r < replicas; ++r) {
      if (!results[r].error.empty()) throw Error("replica " + std::to_string(r) + ": " + results[r].error);
    }
  }
  if (rank != 0) return 0;
  const ReplicaResult& r0 = results[0];
  bool equal = true;
  for (const ReplicaResult& r : results) equal = equal && r.checksum == r0.checksum;
  const double m = mean_of(r0.step_s), sd = std_of(r0.step_s);
  std::printf("hybrid: %s x %s (%s), global batch %lld, split %lld, %s\n",
              count_of(replicas, "replica").c_str(), count_of(p, "stage").c_str(), mpi ? "MPI processes" : "threads",
              static_cast<long long>(o.workload.batch), static_cast<long long>(split),
              schedule.name.c_str());
  std::printf("  step %.3f +- %.3f s   %.1f images/s%s\n", m, sd,
              static_cast<double>(o.workload.batch) / m,
              any_cuda(devices) && cuda::kSimulated ? "   SIMULATED" : "");
  for (int s = 0; s < p; ++s) {
    std::printf("  stage %d: gradient allreduce hidden behind computation %.0f%%\n", s,
                100.0 * (s < static_cast<int>(r0.overlap.size()) ? r0.overlap[s] : 0.0));
  }
  if (!mpi) std::printf("  replicas equal after training: %s\n", equal ? "yes" : "NO");
  if (!o.json.empty()) {
    nlohmann::json j = {{"mode", "hybrid"}, {"replicas", replicas}, {"stages", p},
                        {"transport", mpi ? "mpi" : "local"}, {"batch", o.workload.batch},
                        {"split_size", split}, {"schedule", schedule.name},
                        {"chunks", schedule.chunks}, {"step_s", r0.step_s},
                        {"step_s_mean", m}, {"step_s_std", sd},
                        {"overlap_fraction", r0.overlap}, {"replicas_equal", equal}};
    write_output_file("--json", o.json, j.dump(2) + "\n");
  }
  if (!mpi && !equal) {
    std::fprintf(stderr, "resnet_bench: the replicas' parameters differ after training\n");
    return 1;
  }
  return 0;
}

int run(Options& o) {
  const std::vector<SweepSchedule> schedules = parse_schedules(o.schedule, o.chunks);
  const bool several = schedules.size() > 1;
  KILN_CHECK_INPUT(!several || (o.dp == 1 && !launched_by_mpi()), "--dp and mpirun run one "
                   "pipeline schedule: give one --schedule (got ", o.schedule, ")");
  KILN_CHECK_INPUT(!o.refine_cut || o.balance != "tutorial", "--refine-cut moves the cut, "
                   "--balance tutorial keeps the tutorial's fixed one: give --balance time (or "
                   "params) with --refine-cut, or drop --refine-cut");
  KILN_CHECK_INPUT(!o.refine_cut || (o.dp == 1 && !launched_by_mpi()), "--refine-cut refines "
                   "the split-size sweep's cuts; --dp and mpirun run one pipeline at the "
                   "time-balanced cut: drop --refine-cut");
  const bool refine = o.refine_cut || (!o.no_refine_cut && o.balance == "time");
  // The outputs are written at the end of the benchmark: refused now, not after it. With
  // several schedules, --trace names one file per schedule.
  std::vector<OutputPath> outputs = {{"--csv", o.csv}, {"--json", o.json}};
  for (const SweepSchedule& sc : schedules) {
    outputs.push_back(
        {"--trace", o.trace.empty() ? "" : trace_path_for(o.trace, sc.name, several)});
  }
  check_output_paths(outputs);
  if (o.devices.empty()) {
    o.devices = cuda::device_count() >= 2 ? "cuda:0,cuda:1" : "cpu:0,cpu:1";
  }
  std::vector<Device> devices = parse_devices(o.devices);
  const int p = static_cast<int>(devices.size());
  const std::vector<std::string> modes = split_list(o.modes);
  KILN_CHECK_INPUT(!modes.empty(), "--modes \"", o.modes, "\" names no mode: give one or more of "
                   "single, model-parallel, pipeline, comma-separated");
  for (const std::string& m : modes) {
    KILN_CHECK_INPUT(m == "single" || m == "model-parallel" || m == "pipeline", "--modes: each "
                     "must be one of single, model-parallel, pipeline (got ", m, ")");
  }
  auto has_mode = [&](const char* m) { return std::find(modes.begin(), modes.end(), m) != modes.end(); };
  // Split sizes matter to the pipelines only (a smaller --batch-size with --modes single must
  // not trip over the default sweep).
  const std::vector<int64_t> sizes = has_mode("pipeline") || o.dp > 1 || launched_by_mpi()
                                         ? parse_split_sizes(o.split_sizes, o.workload.batch)
                                         : std::vector<int64_t>{};
  // One batch of input images (the activations come on top, many times larger).
  const Workload& w = o.workload;
  check_fits_in_memory("--batch-size", std::to_string(w.batch),
                       static_cast<double>(w.batch) * 3 * w.image * w.image * sizeof(float),
                       detail::str("one batch of 3x", w.image, "x", w.image,
                                   " f32 images (--image-size ", w.image, ")"));
  const bool cpu_devices = !any_cuda(devices);
  const Precision precision = setup_precision(o.workload.precision, devices[0]);
  for (const Device& d : devices)  // tf32 is a switch per device: all of them, or none
    KILN_CHECK_INPUT(precision != Precision::TF32 || d.is_cuda(), "--precision tf32 needs CUDA "
                     "devices only, got ", d.str(), " in --devices ", o.devices);
  KILN_CHECK_INPUT(precision != Precision::FP16 || (modes.size() == 1 && modes[0] == "single" &&
                                                    o.dp == 1 && !launched_by_mpi()),
                   "--precision fp16 needs loss scaling, which the pipelines do not do: use "
                   "--precision bf16 (no loss scaling needed), or --modes single for fp16");
  KILN_CHECK_INPUT(!o.cuda_graph || (has_mode("single") && devices[0].is_cuda() && o.dp == 1 &&
                                      !launched_by_mpi()),
                   "--cuda-graph times the single-device step as a CUDA graph: it needs "
                   "--modes single (among others) and a CUDA first device in --devices "
                   "(e.g. --devices cuda:0), without --dp or mpirun");
  o.workload.autocast = autocast_dtype_of(precision);
  o.workload.outputs = parse_activations(o.workload.activations_flag);
  o.workload.memory_format = o.workload.memory_format_flag == "channels_last"
                                 ? MemoryFormat::ChannelsLast
                                 : MemoryFormat::Contiguous;
  if (has_mode("pipeline") || o.dp > 1 || launched_by_mpi()) {
    const int blocks = static_cast<int>(resnet_blocks(*make_model(o.workload)).size());
    for (const SweepSchedule& sc : schedules) check_pieces(o.workload, blocks, sc.pieces(p));
  }
  const int hw = hardware_threads();
  const int threads = o.threads_per_stage > 0 ? o.threads_per_stage : std::max(1, hw / p);
  const char* sim = any_cuda(devices) && cuda::kSimulated ? "   SIMULATED" : "";
  // Under mpirun, rank 0 alone prints.
  if (launched_as_nonzero_rank()) std::freopen("/dev/null", "w", stdout);

  std::printf("resnet_bench: %s, %lldx%lld images, batch %lld, %lld classes, MSE on one-hot "
              "labels, SGD lr %g, %s%s%s\n", o.workload.model.c_str(),
              static_cast<long long>(o.workload.image), static_cast<long long>(o.workload.image),
              static_cast<long long>(o.workload.batch), static_cast<long long>(o.workload.classes),
              o.workload.lr, o.workload.precision.c_str(),
              is_low_precision(o.workload.autocast) &&
                      o.workload.outputs == AutocastOutputs::LowPrecision
                  ? " (16-bit activations)"
                  : "",
              o.workload.memory_format == MemoryFormat::ChannelsLast ? ", channels-last" : "");
  std::printf("devices %s; %d CPU thread%s per stage (%d cores)%s\n", o.devices.c_str(), threads,
              threads == 1 ? "" : "s", hw, sim);
  double slowdown = 0;
  if (cpu_devices) {
    slowdown = cpu_parallel_slowdown(threads);
    std::printf("parallel check: two CPU stages at once take %.2fx the time of one alone "
                "(1.0: truly parallel; 2.0: they share the cores)\n", slowdown);
  }
  if (o.dp > 1 || launched_by_mpi()) return run_hybrid(o, devices, threads, schedules[0]);

  // The cut of the whole batch (naive model parallelism), and one per split size and number
  // of pieces (devices, or devices x chunks for interleaved), each measured at its split size.
  Plan plan = make_plan(o.workload, o.balance, devices,
                        profile_blocks(o.workload, devices, threads, o.workload.batch), p);
  std::printf("\nstage plan for the whole batch (--balance %s; ms measured on %s):\n%s",
              o.balance.c_str(), devices[0].str().c_str(), plan.text.c_str());
  std::map<int64_t, std::vector<double>> split_ms;
  std::map<std::pair<int64_t, int>, Plan> split_plans;
  auto plan_for = [&](int64_t split, int pieces) -> const Plan& {
    auto it = split_plans.find({split, pieces});
    if (it != split_plans.end()) return it->second;
    if (!split_ms.count(split)) {
      split_ms[split] = profile_blocks(o.workload, devices, threads, split);
    }
    return split_plans[{split, pieces}] = make_plan(o.workload, o.balance, devices,
                                                    split_ms[split], pieces);
  };
  if (has_mode("pipeline")) {
    std::vector<int> piece_counts;
    for (const SweepSchedule& sc : schedules) {
      if (std::find(piece_counts.begin(), piece_counts.end(), sc.pieces(p)) == piece_counts.end())
        piece_counts.push_back(sc.pieces(p));
    }
    for (int pieces : piece_counts) {
      std::printf("cut into %d pieces per split size:", pieces);
      for (int64_t split : sizes) {
        std::printf(" %lld: %s;", static_cast<long long>(split),
                    plan_for(split, pieces).cut.c_str());
      }
      std::printf("\n");
    }
  }

  // Build every setup, then warm each up.
  std::vector<std::unique_ptr<Run>> runs;
  if (has_mode("single")) {
    runs.push_back(make_single_run(o.workload, devices[0], threads,
                                   detail::str("single (", threads, " thread", threads == 1 ? "" : "s", ")")));
    if (cpu_devices && hw > threads) {
      runs.push_back(make_single_run(o.workload, devices[0], hw,
                                     detail::str("single (", hw, " threads)")));
    }
    if (o.cuda_graph) {  // beside the eager run, alternating with it in every repeat
      runs.push_back(make_single_run(o.workload, devices[0], threads, "single (cuda graph)",
                                     /*cuda_graph=*/true));
    }
  }
  if (has_mode("model-parallel")) {
    PipelineOptions po;
    po.schedule = Schedule::Naive;
    po.threads_per_stage = threads;
    auto r = std::make_unique<PipelineRun>(o.workload, plan.partition, devices, po);
    r->mode = "model-parallel";
    r->label = "model parallel";
    runs.push_back(std::move(r));
  }
  auto pipeline_run = [&](const SweepSchedule& sc, int64_t split, const Partition& partition) {
    auto r = std::make_unique<PipelineRun>(
        o.workload, partition, devices,
        pipeline_options(sc.schedule, sc.chunks, split, o.recompute, threads));
    r->mode = "pipeline";
    r->label = detail::str("pipeline ", sc.name, sc.chunks > 1 ? detail::str(" v", sc.chunks) : "",
                           " split ", split);
    return r;
  };
  if (has_mode("pipeline")) {
    for (int64_t split : sizes) {
      for (const SweepSchedule& sc : schedules) {  // the schedules side by side at each split
        runs.push_back(pipeline_run(sc, split, plan_for(split, sc.pieces(p)).partition));
      }
    }
  }
  const Batch batch = for_devices(random_batch(o.workload, 42), devices);
  std::printf("\nwarming up %zu setups...\n", runs.size());
  for (auto& r : runs) {  // one setup at a time: a pipeline's steps run on after step() returns
    for (int i = 0; i < r->warmup_steps(); ++i) r->step(batch);
    r->finish();
  }
  for (int rep = 0; rep < o.repeats; ++rep) {
    for (auto& r : runs) r->step_seconds.push_back(time_steps(*r, batch, o.steps));
    std::printf("repeat %d of %d done\n", rep + 1, o.repeats);
    std::fflush(stdout);
  }

  // The single device's FLOP rate (apps/common/step_flops.h): the model FLOPs of one step.
  const StepFlops flops = step_flops(*make_model(o.workload), {o.workload.batch, 3, o.workload.image,
                                     o.workload.image}, true, devices[0], precision);
  // The table.
  const double base = runs.empty() ? 0 : mean_of(runs[0]->step_seconds);
  CsvOut csv(o.csv, false,
             "model,image,batch,mode,label,schedule,chunks,split_size,micro_batches,repeats,steps,"
             "step_s_mean,step_s_std,images_per_s,speedup_vs_first,simulated,cut");
  std::printf("\n%-34s %14s %10s %9s\n", "setup", "step s", "images/s", "vs first");
  nlohmann::json jruns = nlohmann::json::array();
  Run* best = nullptr;
  std::map<std::string, Run*> best_of;  // per schedule name: its fastest split
  const std::vector<Block> named_blocks = resnet_blocks(*make_model(o.workload));  // for names
  auto cut_of = [&](Run& r) {  // the first block of each stage; none for the single device
    return r.mode == "single" ? std::vector<std::string>{}
                              : cut_names(static_cast<PipelineRun&>(r).pipeline().partition(),
                                          named_blocks);
  };
  auto joined = [](const std::vector<std::string>& names) {  // no commas: a CSV field
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : " ") + n;
    return text;
  };
  for (auto& r : runs) {
    const double m = mean_of(r->step_seconds), sd = std_of(r->step_seconds);
    const double ips = static_cast<double>(o.workload.batch) / m;
    const bool single = r->mode == "single";
    std::printf("%-34s %7.3f+-%5.3f %10.1f %8.2fx%s%s\n", r->label.c_str(), m, sd, ips, base / m,
                single ? flops.suffix(m).c_str() : "", sim);
    csv.row(detail::str(o.workload.model, ",", o.workload.image, ",", o.workload.batch, ",",
                        r->mode, ",", r->label, ",", r->schedule, ",",
                        r->chunks > 0 ? std::to_string(r->chunks) : "", ",", r->split, ",",
                        r->micro_batches, ",", o.repeats, ",", o.steps, ",", m,
                        ",", sd, ",", ips, ",", base / m, ",", *sim ? 1 : 0, ",",
                        joined(cut_of(*r))));
    jruns.push_back({{"mode", r->mode}, {"label", r->label}, {"split_size", r->split},
                     {"micro_batches", r->micro_batches}, {"step_s", r->step_seconds},
                     {"step_s_mean", m}, {"step_s_std", sd}, {"images_per_s", ips},
                     {"speedup_vs_first", base / m}});
    if (!single) jruns.back()["cut"] = cut_of(*r);
    if (!r->schedule.empty()) {
      jruns.back()["schedule"] = r->schedule;
      jruns.back()["chunks"] = r->chunks;
    }
    if (single) jruns.back().update(flops.json(m));  // model_flops_per_step, achieved_tflops, mfu
    if (r->scaler()) jruns.back()["loss_scale"] = loss_scale_json(*r->scaler());
    if (r->mode != "pipeline") continue;
    if (!best || m < mean_of(best->step_seconds)) best = r.get();
    Run*& b = best_of[r->schedule];
    if (!b || m < mean_of(b->step_seconds)) b = r.get();
  }
  nlohmann::json report = {
      {"model", o.workload.model}, {"image", o.workload.image}, {"batch", o.workload.batch},
      {"classes", o.workload.classes}, {"precision", o.workload.precision},
      {"memory_format", memory_format_name(o.workload.memory_format)}, {"devices", o.devices},
      {"activations", is_low_precision(o.workload.autocast) ? o.workload.activations_flag : "f32"},
      {"threads_per_stage", threads},
      {"cores", hw}, {"balance", o.balance}, {"schedule", o.schedule}, {"chunks", o.chunks},
      {"recompute", o.recompute}, {"refine_cut", refine}, {"repeats", o.repeats},
      {"steps", o.steps},
      {"simulated", *sim != 0}, {"plan", plan.text}, {"block_ms", plan.block_ms},
      {"partition", plan.partition.bounds}, {"runs", jruns}};
  if (cpu_devices) report["parallel_slowdown"] = slowdown;

  if (best) {
    // Each schedule's best split once more, traced: the measured bubble beside the ideal one,
    // of one step alone and of consecutive steps that overlap.
    std::printf("\neach schedule's best split, traced once more: the bubble measured (idle share "
                "of stage time)\nbeside the ideal one (equal stages, unit F/B/W times, free "
                "copies), of one step alone and of\n%d consecutive steps submitted at once "
                "(they overlap):\n", kOverlappedSteps);
    nlohmann::json jbest = nlohmann::json::array();
    if (refine) {
      std::printf("(--refine-cut: each best split's cut and its neighbours timed first, 1 "
                  "warm-up + the fastest of 2 steps each, the fastest cut traced)\n");
    }
    std::vector<std::unique_ptr<PipelineRun>> refined_runs;  // the refined cuts' setups
    double refine_s = 0;  // the refinement's own time (its cost)
    for (const SweepSchedule& sc : schedules) {
      auto* swept = static_cast<PipelineRun*>(best_of.at(sc.name));
      auto* pr = swept;
      const std::string name = sc.chunks > 1 ? detail::str(sc.name, " v", sc.chunks) : sc.name;
      nlohmann::json jrefine;
      if (refine) {
        const auto refine_t0 = std::chrono::steady_clock::now();
        // The swept run (warm) times the time-balanced cut; each neighbour gets a fresh setup.
        const Partition& start = swept->pipeline().partition();
        const Refinement rf = refine_cut(
            start, sc.pieces(p) == 2 ? 1 : 2, kRefineMinGain, [&](const Partition& cut) {
              // One warm-up step for the swept run too: idle since its repeats, it starts cold.
              if (cut.bounds == start.bounds) return fastest_step_s(*swept, batch, 1, 2);
              auto candidate = pipeline_run(sc, swept->split, cut);
              return fastest_step_s(*candidate, batch, 1, 2);
            });
        const std::string from = cut_text(rf.start.partition, named_blocks);
        const std::string to = cut_text(rf.best.partition, named_blocks);
        const bool moved = rf.best.partition.bounds != start.bounds;
        std::printf("  %s split %lld: cut %s %s %s (%.3f -> %.3f s, %zu cuts timed)\n",
                    name.c_str(), static_cast<long long>(swept->split),
                    from.c_str(), moved ? "->" : "kept, not", moved ? to.c_str() : "moved",
                    rf.start.step_s, rf.best.step_s, rf.tried.size());
        nlohmann::json jtried = nlohmann::json::array();
        for (const TriedCut& t : rf.tried) {
          jtried.push_back({{"cut", cut_names(t.partition, named_blocks)}, {"step_s", t.step_s}});
        }
        jrefine = {{"cut_balanced", cut_names(start, named_blocks)},
                   {"cut", cut_names(rf.best.partition, named_blocks)},
                   {"step_s_balanced", rf.start.step_s}, {"step_s", rf.best.step_s},
                   {"tried", jtried}};
        if (moved) {  // the refined cut's setup, warmed up, is the one traced
          refined_runs.push_back(pipeline_run(sc, swept->split, rf.best.partition));
          pr = refined_runs.back().get();
          pr->step(batch);
          pr->finish();
        }
        refine_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - refine_t0)
                        .count();
      }
      const std::string path = o.trace.empty() ? "" : trace_path_for(o.trace, sc.name, several);
      jbest.push_back(traced_bubble_report(*pr, sc, batch, p, path, swept == best));
      jbest.back()["step_s_mean"] = mean_of(swept->step_seconds);  // the sweep's figure
      jbest.back()["cut"] = cut_of(*pr);
      if (!path.empty()) jbest.back()["trace"] = path;
      if (refine) jbest.back()["refinement"] = jrefine;
      if (swept == best) {
        report["best"] = jbest.back();
        // The name older reports used.
        report["best"]["bubble_theoretical"] = jbest.back()["bubble_ideal"];
      }
    }
    report["best_per_schedule"] = jbest;
    if (refine) {
      std::printf("--refine-cut took %.1f s\n", refine_s);
      report["refine_s"] = refine_s;
    }
    if (!o.trace.empty()) {
      std::printf("trace of each step: %s (open in https://ui.perfetto.dev; tools/plot.py "
                  "--trace draws its Gantt chart)\n",
                  several ? trace_path_for(o.trace, "<schedule>", true).c_str() : o.trace.c_str());
    }
    auto* pr = static_cast<PipelineRun*>(best);
    const int64_t best_split = pr->split;
    const Plan& best_plan = plan_for(best_split, pr->pipeline().partition().stages());
    std::printf("the fastest (%s) stage plan:\n%s", pr->label.c_str(), best_plan.text.c_str());
    report["best"]["plan"] = best_plan.text;
    if (refine && report["best"]["refinement"]["cut"] != report["best"]["refinement"]["cut_balanced"]) {
      const std::string refined = report["best"]["refinement"]["cut"].dump();
      std::printf("refined by --refine-cut to the stages starting at %s\n", refined.c_str());
    }

    // Activation memory per stage at that split: gpipe, 1f1b, the swept schedules, recompute.
    refined_runs.clear();
    runs.clear();  // free the timed setups first (pr with them)
    report["memory"] = memory_comparison(o.workload, devices, threads, best_split, schedules, batch,
                                         [&](int pieces) { return plan_for(best_split, pieces); });
  }
  if (!o.json.empty()) write_output_file("--json", o.json, report.dump(2) + "\n");
  return 0;
}

void add_flags(CLI::App& app, Options& o) {
  Workload& w = o.workload;
  // --help shows each flag's default; "tutorial" names the value PyTorch's model-parallel
  // tutorial used, where it differs.
  app.option_defaults()->always_capture_default();
  app.add_option("--model", w.model, "resnet18|34|50|101|152 (the tutorial used resnet50)")
      ->check(one_of({"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}));
  app.add_option("--image-size", w.image, "image height and width (the tutorial used 128)")
      ->check(in_range(int64_t{32}, int64_t{4096}));
  app.add_option("--batch-size", w.batch, "images per step (the tutorial used 120)")
      ->check(in_range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--classes", w.classes, "classes of the one-hot labels (the tutorial used 1000)")
      ->check(in_range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--width", w.width, "stem channels: 64 is the real net; 8 or 16 give narrow nets "
                 "of the same depth (smoke tests, the CUDA simulator)")
      ->check(in_range(int64_t{8}, int64_t{64}));
  app.add_option("--lr", w.lr, "SGD learning rate (the tutorial used 0.001)")->check(above(0.0));
  app.add_option("--precision", w.precision, kPrecisionHelp)
      ->check(one_of({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--memory-format", w.memory_format_flag,
                 "images and activations: contiguous (NCHW; channel-blocked on the CPU where "
                 "faster) or channels_last (NHWC)")
      ->check(one_of({"contiguous", "channels_last"}));
  app.add_option("--activations", w.activations_flag,
                 std::string(kActivationsHelp) + "; the single-device run only (pipeline "
                 "stages exchange f32 activations)")
      ->check(one_of({"16bit", "f32"}));
  app.add_option("--modes", o.modes, "comma list of single, model-parallel, pipeline");
  app.add_option("--devices", o.devices,
                 "one device per stage: cuda:0,cuda:1 or cpu:0,cpu:1 (default: two GPUs when "
                 "present, else the CPU devices)");
  app.add_option("--schedule", o.schedule,
                 "pipeline schedules, a comma list of gpipe, 1f1b, zb-h1, zb-h2 (zero bubble: "
                 "backward split into input and weight gradients), interleaved (each device "
                 "holds --chunks model pieces); the sweep times each at every split size");
  app.add_option("--chunks", o.chunks,
                 "interleaved schedule: model chunks per device (the model is cut into devices x "
                 "chunks pieces); the other schedules keep one piece per device")
      ->check(in_range(1, 64));
  app.add_flag("--recompute", o.recompute, "pipeline: re-materialise activations in backward");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "single mode on a CUDA device: also time the step captured into one CUDA graph "
               "and replayed (engine/step_graph.h), beside the eager step");
  app.add_option("--split-sizes", o.split_sizes,
                 "pipeline micro-batch sizes to sweep (the tutorial's)");
  app.add_option("--balance", o.balance,
                 "stage partition: time (measured per block), params, or tutorial "
                 "(conv1..layer2 | layer3..fc)")
      ->check(one_of({"time", "params", "tutorial"}));
  CLI::Option* refine_on = app.add_flag(
      "--refine-cut", o.refine_cut,
      "after the sweep, time each schedule's fastest split again at its cut and the neighbouring "
      "cuts (each stage boundary moved one block, coordinate descent: 3 cuts for 2 pieces, up to "
      "2 rounds over the boundaries for more), 1 warm-up + the fastest of 2 steps each, and "
      "trace the fastest cut: block times measured alone miss the loss, the copies and the "
      "stages' shared caches. Costs about 3 steps per cut tried (~10% more on the default run). "
      "Default: on for --balance time, off for params; refused with tutorial");
  app.add_flag("--no-refine-cut", o.no_refine_cut,
               "keep the balanced cut (e.g. --balance time as measured per block)")
      ->excludes(refine_on);
  app.add_option("--steps", o.steps, "timed steps per repeat (the tutorial used 3)")
      ->check(in_range(1, 100000));
  app.add_option("--repeats", o.repeats, "timed repeats of --steps each (the tutorial used 10)")->check(in_range(1, 100000));
  app.add_option("--threads-per-stage", o.threads_per_stage,
                 "CPU threads of each stage and of the single device (default: cores / stages)")
      ->check(in_range(1, 1024))->always_capture_default(false)->default_str("");
  app.add_option("--dp", o.dp, "hybrid: replicas of the pipeline (threads); under mpirun, one "
                 "replica per process")->check(in_range(1, 64));
  app.add_option("--csv", o.csv, "write one row per setup");
  app.add_option("--json", o.json, "write the whole report");
  app.add_option("--trace", o.trace, "write the best split's step as Chrome trace JSON");
}

}  // namespace
}  // namespace kiln::apps

int main(int argc, char** argv) {
  CLI::App app{"Kiln's model-parallel benchmark: one device vs naive model parallelism vs "
               "pipelined micro-batches (GPipe, 1F1B, zero bubble, interleaved) for a ResNet split over devices, the "
               "split-size sweep, the measured bubble and activation memory, and hybrid data x "
               "pipeline parallelism. The defaults are the tutorial's (ResNet-50, batch 120, "
               "split sizes 1..60) at 64x64 images instead of 128x128, 2 steps x 3 repeats: "
               "about 6 minutes on a 2-core CPU machine."};
  kiln::apps::Options o;
  kiln::apps::add_flags(app, o);
  if (const std::optional<int> rc = kiln::apps::parse_flags(app, argc, argv, "resnet_bench")) {
    return *rc;
  }
  try {
    return kiln::apps::run(o);
  } catch (const kiln::OutOfMemory& e) {
    // The model, the batch and its activations are all sized by the flags.
    const kiln::Error sized = kiln::apps::size_error(
        e, kiln::detail::str("--batch-size ", o.workload.batch, ", --image-size ",
                             o.workload.image, " and --model ", o.workload.model));
    std::fprintf(stderr, "resnet_bench: error: %s\n", sized.what());
    return sized.exit_code();
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "resnet_bench: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_bench: error: %s\n", e.what());
    return 1;
  }
}
