// idx_export.h: writes an MNIST split as an ImageFolder of PNG files (the library half of
// apps/idx_to_imagefolder, kept here so the tests can run it directly).
//
// Layout written:  split_dir/<label>/<index>.png, 8-bit greyscale, 28x28, the IDX bytes
// unchanged (PNG is lossless), <index> zero-padded to the width of the largest index
// (00000.png .. 59999.png) so that file-name order within a class is IDX order.
//
// Atomic and idempotent: the files go into split_dir + ".tmp" (removed first if a crashed
// run left it), a marker split_dir/.kiln_complete records the image count, and the folder is
// renamed to split_dir at the end. A split_dir that already has a marker with the same count
// is left alone (skipped); one with a different count or without a marker is an Input error
// (delete it or choose another directory). ImageFolderDataset ignores the hidden marker.
#pragma once

#include <cstdint>
#include <string>

#include "data/mnist.h"

namespace kiln {

struct IdxExportResult {
  int64_t files = 0;     // PNG files written (or found, when skipped)
  bool skipped = false;  // split_dir was already complete
  double seconds = 0;    // wall time
};

// Writes every example of `dataset` under split_dir (see above). Throws kiln::Error: Input when
// split_dir holds something else; Runtime, naming the file and the system's reason ("File too
// large", "No space left on device"), when a file cannot be written (each file goes through
// engine/output_file.h), after removing the unfinished ".tmp" folder.
IdxExportResult export_idx_split(const MnistDataset& dataset, const std::string& split_dir);

}  // namespace kiln
