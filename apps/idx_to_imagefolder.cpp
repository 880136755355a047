// idx_to_imagefolder: writes MNIST's IDX files as an ImageFolder of PNGs, so that
// `mnist_train --format imagefolder` (and the loader benchmark) decode real image files:
//
//   OUT/train/<label>/<index>.png   (60,000 files, or --limit-train)
//   OUT/test/<label>/<index>.png    (10,000 files, or --limit-test)
//
// Each split is written into OUT/<split>.tmp and renamed when complete, so an interrupted run
// never leaves a half split that looks whole; a split that is already complete is skipped
// (running it again is free). The work is data/idx_export.h.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <CLI/CLI.hpp>

#include "apps/common/data_paths.h"
#include "apps/common/flag_checks.h"
#include "apps/common/output_paths.h"
#include "data/idx_export.h"
#include "data/mnist.h"
#include "engine/error.h"

int main(int argc, char** argv) {
  using namespace kiln;
  CLI::App app{"idx_to_imagefolder: write MNIST (IDX files) as OUT/{train,test}/<label>/<index>.png"};
  std::string data = kiln::apps::in_source_tree("datasets/mnist"), out;
  int64_t limit_train = -1, limit_test = -1;
  app.add_option("--data", data, "directory holding the four MNIST IDX files")->capture_default_str();
  app.add_option("--out", out, "output directory (created if missing)")->required();
  app.add_option("--limit-train", limit_train, "write only the first N training images (-1: all)")
      ->check(apps::at_least(int64_t{-1}))->capture_default_str();
  app.add_option("--limit-test", limit_test, "write only the first N test images (-1: all)")
      ->check(apps::at_least(int64_t{-1}))->capture_default_str();
  if (const std::optional<int> rc = apps::parse_flags(app, argc, argv, "idx_to_imagefolder")) {
    return *rc;
  }
  try {
    for (const auto& [flag, limit] : {std::pair{"--limit-train", limit_train},
                                      std::pair{"--limit-test", limit_test}}) {
      KILN_CHECK_INPUT(limit != 0, flag, " 0 would write no image: pass N >= 1, or -1 for all");
    }
    apps::check_output_directory("--out", out);
    // Both splits are read before OUT is created: bad --data leaves nothing behind.
    const MnistDataset train = MnistDataset::load(data, MnistSplit::Train, limit_train);
    const MnistDataset test = MnistDataset::load(data, MnistSplit::Test, limit_test);
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) throw Error(detail::str("cannot create ", out, ": ", ec.message()), ErrorKind::Input);
    struct Split {
      const char* name;
      const MnistDataset& dataset;
    };
    for (const Split& s : {Split{"train", train}, Split{"test", test}}) {
      const MnistDataset& dataset = s.dataset;
      const std::string dir = (std::filesystem::path(out) / s.name).string();
      const IdxExportResult r = export_idx_split(dataset, dir);
      if (r.skipped) {
        std::printf("%s: already complete (%lld files), skipped\n", dir.c_str(),
                    static_cast<long long>(r.files));
      } else {
        std::printf("%s: wrote %lld PNG files in %.2f s\n", dir.c_str(),
                    static_cast<long long>(r.files), r.seconds);
      }
    }
    return 0;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "idx_to_imagefolder: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "idx_to_imagefolder: error: %s\n", e.what());
    return 1;
  }
}
