// train_step_bench: images/s of one training step (forward, backward, SGD with momentum) or of
// one inference forward, batch in memory, no data loading. The Kiln half of
// tools/bench_vs_pytorch.sh, which runs the same step in PyTorch
// (tools/bench_pytorch_step.py) for the ratio.
//
//   train_step_bench --model mnist_cnn --threads 2 --batch-size 128 --steps 30
//   train_step_bench --model resnet50 --image-size 128 --batch-size 32 --mode train
//   train_step_bench --model resnet50 --image-size 128 --batch-size 32 --mode eval --fold-bn
//   train_step_bench --model resnet50 --device cuda:0 [--precision tf32]   (a GPU; the step is
//                                                     timed to the device's completion)
//   train_step_bench --model resnet50 --device cuda:0 --cuda-graph   (the step captured once
//                            into a CUDA graph, then replayed: engine/step_graph.h; mode=train+graph)
// Prints one line: "kiln model=resnet50 mode=train threads=2 kernels=vendor batch=32
// image=128 images_per_sec=... ms_per_step=..." (the median step of --steps after --warmup),
// the form tools/bench_pytorch_step.py prints too, so that tools/bench_vs_pytorch.sh and
// bench_resnet_vs_pytorch.sh read both alike. --json FILE also writes the flags, the median
// and every timed step's milliseconds as JSON, and for a CUDA device what the host spends on a
// step: kernel_launches_per_step (cuda::launch_count(), engine/cuda/launch_count.h) and
// enqueue_ms_per_step (the median host time to queue one step, up to the wait for the device).
//
// The step queues its work without waiting for the device: loss scaling (--precision fp16)
// runs on the device (GradScaler's device-side path: found_inf never comes back to the host,
// the optimizer's kernels skip on it), so KILN_SYNC_DEBUG=error passes through the timed steps.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/flag_checks.h"
#include "apps/common/mixed_precision.h"
#include "apps/common/output_paths.h"
#include "apps/common/step_flops.h"
#include "engine/output_file.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/optim/grad_scaler.h"
#include "engine/cuda/context.h"
#include "engine/cuda/launch_count.h"
#include "engine/cuda/sync_debug.h"
#include "engine/device.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/allocator.h"
#include "engine/init.h"
#include "engine/memory_format.h"
#include "engine/optim/sgd.h"
#include "engine/parallel.h"
#include "engine/step_graph.h"
#include "layers/loss.h"
#include "models/mnist_cnn.h"
#include "layers/conv2d.h"
#include "models/resnet.h"

#if KILN_WITH_CUDA
#include "engine/cuda/caching_allocator.h"
#endif

using namespace kiln;

int main(int argc, char** argv) {
  CLI::App app{"Kiln: time a training step or an inference forward (batch in memory)"};
  int threads = 1, batch = 128, steps = 30, warmup = 5, image = 128, classes = 1000;
  std::string kernels = "vendor", model = "mnist_cnn", mode = "train", device_spec = "cpu";
  std::string precision = "fp32", json_path, memory_format = "contiguous", activations;
  bool fold_bn = false, winograd = false, cuda_graph = false, per_parameter_step = false;
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.add_option("--model", model, "mnist_cnn or resnet18|34|50|101|152")
      ->check(apps::one_of({"mnist_cnn", "resnet18", "resnet34", "resnet50", "resnet101",
                             "resnet152"}));
  app.add_option("--mode", mode, "train (forward, backward, SGD step) or eval (forward only)")
      ->check(apps::one_of({"train", "eval"}));
  app.add_option("--threads", threads, "CPU threads (OpenMP budget)")
      ->check(apps::in_range(1, 1024));
  app.add_option("--batch-size", batch, "images per step")->check(apps::in_range(1, 1 << 20));
  app.add_option("--image-size", image, "ResNet input height and width (MNIST is 28)")
      ->check(apps::in_range(32, 4096));
  app.add_option("--classes", classes, "ResNet classes")->check(apps::in_range(1, 1 << 20));
  app.add_option("--steps", steps, "timed steps")->check(apps::in_range(1, 100000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(apps::in_range(0, 100000));
  app.add_option("--kernels", kernels, "hand or vendor")->check(apps::one_of({"hand", "vendor"}));
  app.add_flag("--fold-bn", fold_bn, "eval mode: fold each BatchNorm into its convolution");
  app.add_option("--device", device_spec, "cpu or cuda[:N]");
  app.add_option("--precision", precision, apps::kPrecisionHelp)
      ->check(apps::one_of({"fp32", "tf32", "bf16", "fp16"}));
  app.add_flag("--winograd", winograd,
               "CPU vendor kernels: Winograd F(4x4, 3x3) for 3x3 stride-1 convolutions");
  app.add_flag("--cuda-graph", cuda_graph,
               "CUDA: capture the step into a CUDA graph after --warmup - 1 eager steps and time "
               "its replays (engine/step_graph.h)");
  app.add_flag("--per-parameter-step", per_parameter_step,
               "CUDA: the optimizer steps each parameter with its own launches instead of all of "
               "them in one (Optimizer::set_multi_tensor(false); same results)");
  app.add_option("--memory-format", memory_format,
                 "ResNet activations: contiguous (NCHW, or channel-blocked where that is "
                 "faster) or channels_last (NHWC)")
      ->check(apps::one_of({"contiguous", "channels_last"}));
  app.add_option("--activations", activations,
                 std::string(apps::kActivationsHelp) + " (default: 16bit for the ResNets, f32 "
                 "for mnist_cnn, whose dropout takes f32 only)")
      ->check(apps::one_of({"16bit", "f32"}));
  app.add_option("--json", json_path, "also write the result as JSON to this file");
  // --tf32 was this app's spelling of the other apps' --precision tf32.
  if (const std::optional<int> rc =
          apps::parse_flags(app, argc, argv, "train_step_bench",
                            {apps::switch_to_value("--tf32", "--precision", "tf32")})) {
    return *rc;
  }
  try {
    apps::check_output_paths({{"--json", json_path}});  // written after the steps: check now
    KILN_CHECK_INPUT(!fold_bn || (mode == "eval" && model != "mnist_cnn"),
                     "--fold-bn needs --mode eval and a ResNet model");
    for (const char* flag : {"--image-size", "--classes", "--memory-format"}) {
      KILN_CHECK_INPUT(model != "mnist_cnn" || app.count(flag) == 0, flag, " applies to the "
                       "ResNet models (mnist_cnn's images are 1x28x28, 10 classes): drop it or "
                       "pass --model resnet50");
    }
    KILN_CHECK_INPUT(model != "mnist_cnn" || activations != "16bit", "--activations 16bit ",
                     "applies to the ResNet models (mnist_cnn's dropout takes f32 activations): "
                     "drop it or pass --model resnet50");
    if (model != "mnist_cnn") {  // one batch of input images; the activations come on top
      apps::check_fits_in_memory("--batch-size", std::to_string(batch),
                                 static_cast<double>(batch) * 3 * image * image * sizeof(float),
                                 detail::str("one batch of 3x", image, "x", image,
                                             " f32 images (--image-size ", image, ")"));
    }
    const Device device = parse_device(device_spec);
    KILN_CHECK_INPUT(!cuda_graph || device.type == DeviceType::CUDA,
                     "--cuda-graph needs a CUDA device (--device cuda[:N]): a CPU step has no "
                     "launches to save");
    // The eager warm-up settles cuDNN's algorithm search and the optimizer's state, which may
    // allocate and wait: neither may happen inside a capture.
    KILN_CHECK_INPUT(!cuda_graph || warmup >= 2, "--cuda-graph needs --warmup 2 or more (eager "
                     "steps before the capture), got ", warmup);
    const bool on_cuda = device.type == DeviceType::CUDA;
    if (on_cuda) {
      KILN_CHECK_INPUT(cuda::is_available(), cuda::unavailable_reason());
#if KILN_WITH_CUDA
      cuda::check_device(device.index);
#endif
    }
    // tf32 needs a CUDA device; TF32 math is on for tf32 and off otherwise.
    const Precision math = apps::setup_precision(precision, device);
    set_num_threads(threads);
    set_default_impl(parse_impl(kernels.c_str()));
    if (winograd) set_conv_winograd(true);
    manual_seed(1);
    const bool is_resnet = model != "mnist_cnn";
    // Setup waits for the device (the model and the batch are uploaded); the steps must not.
    std::optional<cuda::AllowSync> setup(std::in_place,
                                         "train_step_bench setup: model and batch uploaded");
    std::shared_ptr<Module> net;
    if (is_resnet) {
      auto resnet = make_resnet(model, classes);
      if (fold_bn) {
        resnet->eval();
        resnet->fold_batch_norms();
      }
      net = resnet;
    } else {
      net = make_mnist_cnn();
      classes = 10;
      image = 28;
    }
    const bool train = mode == "train";
    net->train(train);
    net->to(device);
    const bool channels_last = memory_format == "channels_last";
    if (channels_last) net->to(MemoryFormat::ChannelsLast);
    SGD opt(net->parameters(), 0.01, 0.9);
    opt.set_multi_tensor(!per_parameter_step);
    Tensor x = Tensor::empty({batch, is_resnet ? 3 : 1, image, image});
    uniform_(x, -1, 1);
    x = x.to(device);
    std::vector<int64_t> labels(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % classes;
    Tensor y = Tensor::from_vector(labels, {batch}).to(device);
    // The allocator of the step's device: its bytes in use and their peak.
    auto memory_stats = [&]() -> MemoryStats {
#if KILN_WITH_CUDA
      if (on_cuda) return cuda_allocator::stats(device.index);
#endif
      return cpu_allocator::stats();
    };
    auto reset_peak = [&] {
#if KILN_WITH_CUDA
      if (on_cuda) return cuda_allocator::reset_peak(device.index);
#endif
      cpu_allocator::reset_peak();
    };
    // GPU work is asynchronous: a step ends when the device has finished it.
    auto wait_for_device = [&] {
#if KILN_WITH_CUDA
      cuda::AllowSync allow("train_step_bench: a step is timed to the device's completion");
      if (on_cuda) cuda::synchronize();
#endif
    };

    const apps::StepFlops flops = apps::step_flops(*net, x.shape(), train, device, math);
    const DType autocast = autocast_dtype_of(math);
    if (activations.empty()) activations = is_resnet ? "16bit" : "f32";
    const AutocastOutputs outputs = apps::parse_activations(activations);
    const bool lowp_activations =
        is_low_precision(autocast) && outputs == AutocastOutputs::LowPrecision;
    std::optional<GradScaler> scaler;  // fp16: dynamic loss scaling, as training would run it
    if (precision == "fp16") {
      scaler.emplace();
      scaler->keep_on_device(device);
    }
    setup.reset();
    std::vector<double> ms, enqueue_ms;
    int64_t timed_launches = 0, timed_conversions = 0;
    // One step's work, run eagerly or captured once and replayed (StepGraph).
    const auto step = [&]() -> std::vector<Tensor> {
      if (!train) {
        NoGradGuard no_grad;
        AutocastGuard mixed(autocast, true, outputs);
        return {net->forward(x)};
      }
      opt.zero_grad();
      Tensor loss;
      {
        AutocastGuard mixed(autocast, true, outputs);
        loss = cross_entropy(net->forward(x), y);
      }
      if (scaler) {
        scaler->scale(loss).backward();
        scaler->unscale_on_device(net->parameters());
        opt.step(scaler->found_inf());  // skipped on the device when a gradient overflowed
        scaler->update_on_device();
      } else {
        loss.backward();
        opt.step();
      }
      return {loss};
    };
    StepGraphOptions graph_options;
    graph_options.enabled = cuda_graph;
    // The last warm-up step captures: every timed step is a replay.
    graph_options.warmup_steps = std::max(0, warmup - 1);
    StepGraph step_graph(device, graph_options);
    // The step's working memory: the peak of the bytes in use during one eager step, beyond
    // what was held before it (the activations saved for backward, the gradients, every
    // temporary). Measured on the first timed step, or, when the timed steps replay a graph
    // (whose memory was set aside at capture), on the last eager warm-up step.
    const int measured_step = cuda_graph ? warmup - 2 : warmup;
    int64_t step_peak_bytes = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      int64_t held_before = 0;
      if (s == measured_step) {
        wait_for_device();
        reset_peak();
        held_before = memory_stats().current_bytes;
      }
      const int64_t launches_before = cuda::launch_count();
      const int64_t conversions_before = memory_format_conversions();
      auto t0 = std::chrono::steady_clock::now();
      step_graph.run(step);
      const auto queued = std::chrono::steady_clock::now();
      const int64_t launches = cuda::launch_count() - launches_before;
      wait_for_device();
      auto t1 = std::chrono::steady_clock::now();
      if (s == measured_step) step_peak_bytes = memory_stats().peak_bytes - held_before;
      if (s >= warmup) {
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        enqueue_ms.push_back(std::chrono::duration<double, std::milli>(queued - t0).count());
        timed_launches += launches;
        timed_conversions += memory_format_conversions() - conversions_before;
      }
    }
    std::sort(enqueue_ms.begin(), enqueue_ms.end());
    const std::vector<double> step_ms = ms;  // in the order they ran
    std::sort(ms.begin(), ms.end());
    double median = ms[ms.size() / 2];
    std::printf("kiln model=%s mode=%s%s%s%s%s%s%s%s device=%s threads=%d kernels=%s batch=%d "
                "image=%d images_per_sec=%.1f ms_per_step=%.2f step_peak_mb=%.1f%s%s\n",
                model.c_str(), mode.c_str(), cuda_graph ? "+graph" : "", fold_bn ? "+fold" : "",
                winograd ? "+winograd" : "", channels_last ? "+channels_last" : "",
                precision == "tf32" ? "+tf32" : "", is_low_precision(autocast) ? ("+" + precision).c_str() : "",
                lowp_activations ? "+16bit_activations" : "",
                device.str().c_str(), threads, kernels.c_str(),
                batch, image, batch * 1000.0 / median, median, step_peak_bytes / 1e6,
                flops.suffix(median / 1000).c_str(),
                on_cuda && cuda::kSimulated ? " SIMULATED" : "");
    if (!json_path.empty()) {
      nlohmann::json j = {
          {"app", "train_step_bench"}, {"model", model}, {"mode", mode},
          {"device", device.str()}, {"threads", threads}, {"kernels", kernels},
          {"precision", precision}, {"fold_bn", fold_bn}, {"winograd", winograd},
          {"batch_size", batch}, {"image_size", image}, {"classes", classes},
          {"steps", steps}, {"warmup", warmup}, {"ms_per_step", median},
          {"images_per_sec", batch * 1000.0 / median}, {"step_ms", step_ms},
          {"simulated", on_cuda && cuda::kSimulated}, {"cuda_graph", cuda_graph},
          {"per_parameter_step", per_parameter_step},
          {"kernel_launches_per_step", static_cast<double>(timed_launches) / steps},
          {"enqueue_ms_per_step", enqueue_ms[enqueue_ms.size() / 2]},
          {"memory_format", memory_format}, {"step_peak_bytes", step_peak_bytes},
          {"activations", lowp_activations ? "16bit" : "f32"},
          {"memory_format_conversions_per_step",
           static_cast<double>(timed_conversions) / steps}};
      j.update(flops.json(median / 1000));  // model_flops_per_step, achieved_tflops, mfu
      write_output_file("--json", json_path, j.dump(2) + "\n");
    }
  } catch (const OutOfMemory& e) {
    // Every buffer is sized by the flags: the model, the batch and its activations.
    const Error sized = apps::size_error(e, detail::str("--batch-size ", batch, ", --image-size ",
                                                        image, " and --model ", model));
    std::fprintf(stderr, "train_step_bench: error: %s\n", sized.what());
    return sized.exit_code();
  } catch (const Error& e) {
    std::fprintf(stderr, "train_step_bench: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
