// output_paths.h: the output files an app will write, checked right after its flags are parsed
// and before any work, so that an hour of training never ends in "cannot write" and an output
// never replaces something that is not an output file.
//
//   if (auto rc = apps::parse_flags(app, argc, argv, "resnet_bench")) return *rc;
//   apps::check_output_paths({{"--csv", o.csv}, {"--json", o.json}, {"--trace", o.trace}});
//
// Each refusal is a Usage error (exit 2) naming the flag and the path, with the system's reason:
//   --checkpoint /dev/full         "--checkpoint /dev/full is a character device, not a regular
//                                   file: give the path of a file (Kiln replaces the file it writes)"
//   --json a.out --checkpoint a.out  "--json a.out and --checkpoint a.out name the same file: ..."
//   --json /tmp                    "--json /tmp: Is a directory: give the path of a file"
//   --json nodir/run.json          "--json nodir/run.json: the directory nodir does not exist: ..."
//   --json ro/run.json             "--json ro/run.json: cannot create a file in ro: Permission denied"
//   --json file/run.json           "--json file/run.json: file is not a directory: Not a directory"
//
// What is checked, for every output with a non-empty path (an empty path: not requested):
//   * the path, when it exists, is a regular file (not a directory, a character or block device,
//     a FIFO or a socket; a symbolic link is judged by its target) the app may write;
//   * its directory exists, is a directory, and the app may create files in it (the writers
//     write a temporary file there and rename it: engine/output_file.h);
//   * no two outputs name the same file, compared as files: the same canonical path (so "./x"
//     and "x" are one file) or, for files that exist, the same device and inode (hard links);
//   * no output names one of the app's input files, except the output an input allows
//     (mnist_train --resume x --checkpoint x continues a run in place: InputPath::may_share).
// access(2) answers the permission questions, so a process running as root, which may write
// anywhere, passes them; the write itself still reports what the system says (exit 1).
#pragma once

#include <string>
#include <vector>

namespace kiln::apps {

// An output: the flag that chose it ("--json") and its path ("" when not given).
struct OutputPath {
  std::string flag;
  std::string path;
};

// An input file the outputs must not overwrite; `may_share` is the flag of the one output that
// may name the same file ("" for none).
struct InputPath {
  std::string flag;
  std::string path;
  std::string may_share = "";
};

// Throws kiln::Error (Usage) at the first output that cannot be written (see above).
void check_output_paths(const std::vector<OutputPath>& outputs,
                        const std::vector<InputPath>& inputs = {});

// An output directory (idx_to_imagefolder --out), created if missing: refused when the path
// exists and is not a directory, or when its nearest existing ancestor is not a directory the
// app may create entries in. Throws kiln::Error (Usage).
void check_output_directory(const std::string& flag, const std::string& dir);

}  // namespace kiln::apps
