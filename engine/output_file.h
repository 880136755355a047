// output_file.h: the one way Kiln writes a whole output file (a JSON summary, a trace, a report,
// a PNG of an exported dataset), so that a failed write never destroys what was there and is
// reported in words.
//
//   write_output_file("--json", "run.json", j.dump(2) + "\n");
//       past `ulimit -f`  ->  kiln::Error (Runtime, exit 1):
//       "--json run.json: writing failed: File too large; the previous run.json is left as it was"
//
// How: the bytes go to a new file next to the target (same directory, so the same file system:
// "<path>.tmp.<pid>.<n>", created with O_EXCL so that nothing else is overwritten), which is
// then renamed over `path` (rename(2) replaces the target atomically: a reader sees the old file
// or the new one, never a torn one). Any failure (a full disk: ENOSPC; a file-size limit: EFBIG;
// an I/O error) removes the temporary file and throws, so the previous file keeps its bytes. A
// symbolic link at `path` is followed: its target is replaced and the link stays a link.
//
// Not fsynced: an output of a run is not a checkpoint, and a crash of the whole machine right
// after the rename may lose it (the file system then holds the old file or an empty one). The
// checkpoint writer (engine/serialize.h) keeps its own atomic write, with fsyncs.
//
// Writes past a file-size limit (RLIMIT_FSIZE, `ulimit -f`) fail with EFBIG only when SIGXFSZ is
// ignored; otherwise the kernel kills the process with that signal before write() returns. Every
// Kiln app ignores it once at start (ignore_file_size_signal(), called by apps::parse_flags).
//
// The paths themselves (a device, a FIFO, a directory, two outputs naming one file, a missing
// directory) are checked before any work by apps/common/output_paths.h; this writer trusts them
// only as far as the system does: an error found here is a runtime failure (exit 1).
#pragma once

#include <string>
#include <string_view>

namespace kiln {

// Replaces the file at `path` with `bytes` (see above). `what` names the output in messages: the
// flag that chose the path ("--json"), or words ("the trace"). Throws kiln::Error (Runtime)
// "<what> <path>: <step> failed: <strerror>", and when `path` held a file, "; the previous
// <path> is left as it was".
void write_output_file(const std::string& what, const std::string& path, std::string_view bytes);

// Makes a write past the file-size limit fail with EFBIG instead of killing the process with
// SIGXFSZ (signal(SIGXFSZ, SIG_IGN); POSIX setrlimit(2), write(2)). Idempotent.
void ignore_file_size_signal();

// Writes all of `bytes` to `fd`, retrying short writes and EINTR: 0, or the errno of the write
// that failed (at a full disk or the file-size limit the retry after a short write fails with
// ENOSPC or EFBIG, the reason to report).
int write_all(int fd, std::string_view bytes);

// "--csv rows.csv: <step> failed: <strerror of err>": the message of an output that failed while
// it was being written in place (a CSV file that grows row by row).
std::string output_failure(const std::string& what, const std::string& path,
                           const std::string& step, int err);

}  // namespace kiln
