// output_paths.cpp: see output_paths.h.
#include "apps/common/output_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "engine/error.h"

namespace kiln::apps {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const std::string& message) { throw Error(message, ErrorKind::Usage); }

// What a path that exists and is not a regular file is, for the message; "" for a regular file.
const char* kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The directory a file path lives in ("." for a bare name).
std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// The directory `dir` (of output `flag` `path`) exists, is a directory, and the app may create
// files in it.
void check_parent(const std::string& flag, const std::string& path, const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      refuse(flag + " " + path + ": the directory " + dir + " does not exist: create it first");
    }
    refuse(flag + " " + path + ": " + dir + ": " + std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode)) {
    refuse(flag + " " + path + ": " + dir + " is not a directory: " + std::strerror(ENOTDIR));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    refuse(flag + " " + path + ": cannot create a file in " + dir + ": " + std::strerror(err));
  }
}

void check_one(const OutputPath& out) {
  const std::string& flag = out.flag;
  const std::string& path = out.path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      refuse(flag + " " + path + ": " + std::strerror(EISDIR) + ": give the path of a file");
    }
    if (!S_ISREG(st.st_mode)) {
      refuse(flag + " " + path + " is " + kind_of(st.st_mode) + ", not a regular file: give the "
             "path of a file (Kiln replaces the file it writes)");
    }
    if (::access(path.c_str(), W_OK) != 0) {
      const int err = errno;
      refuse(flag + " " + path + ": " + std::strerror(err));
    }
    check_parent(flag, path, parent_of(path));
    return;
  }
  const int err = errno;
  // Absent (or under something that is not a directory): the directory must take a new file.
  if (err == ENOENT || err == ENOTDIR) {
    check_parent(flag, path, parent_of(path));
    if (err == ENOENT) return;  // a new file in a directory that takes it
  }
  refuse(flag + " " + path + ": " + std::strerror(err));  // EACCES, ELOOP, ENAMETOOLONG...
}

// A file's identity for comparing two paths: its canonical path (the existing part resolved:
// "./x" and "x", "d/../x" and "x", a symbolic link and its target) and, when it exists, its
// device and inode (hard links).
struct Identity {
  std::string canonical;
  std::optional<std::pair<dev_t, ino_t>> inode;
};

Identity identity_of(const std::string& path) {
  Identity id;
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
  id.canonical = ec ? fs::absolute(path).lexically_normal().string() : canonical.string();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) id.inode = std::make_pair(st.st_dev, st.st_ino);
  return id;
}

bool same_file(const Identity& a, const Identity& b) {
  if (a.inode && b.inode) return *a.inode == *b.inode;
  return a.canonical == b.canonical;
}

}  // namespace

void check_output_paths(const std::vector<OutputPath>& outputs,
                        const std::vector<InputPath>& inputs) {
  std::vector<const OutputPath*> given;
  for (const OutputPath& out : outputs) {
    if (out.path.empty()) continue;
    check_one(out);
    given.push_back(&out);
  }
  std::vector<Identity> ids;
  for (const OutputPath* out : given) ids.push_back(identity_of(out->path));
  for (size_t i = 0; i < given.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (!same_file(ids[i], ids[j])) continue;
      refuse(given[j]->flag + " " + given[j]->path + " and " + given[i]->flag + " " +
             given[i]->path + " name the same file: one would overwrite the other; give each "
             "output its own path");
    }
  }
  for (const InputPath& in : inputs) {
    if (in.path.empty()) continue;
    const Identity input = identity_of(in.path);
    for (size_t i = 0; i < given.size(); ++i) {
      if (given[i]->flag == in.may_share || !same_file(input, ids[i])) continue;
      refuse(given[i]->flag + " " + given[i]->path + " is the input " + in.flag + " " + in.path +
             ": writing it would destroy it; give " + given[i]->flag + " another path");
    }
  }
}

void check_output_directory(const std::string& flag, const std::string& dir) {
  if (dir.empty()) return;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      refuse(flag + " " + dir + " is " + (S_ISREG(st.st_mode) ? "a file" : kind_of(st.st_mode)) +
             ", not a directory: give a directory (created if missing)");
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      const int err = errno;
      refuse(flag + " " + dir + ": cannot create entries in it: " + std::strerror(err));
    }
    return;
  }
  const int err = errno;
  if (err != ENOENT && err != ENOTDIR) refuse(flag + " " + dir + ": " + std::strerror(err));
  // Missing: created with its missing parents, under the nearest ancestor that exists.
  fs::path ancestor = fs::absolute(dir).lexically_normal();
  while (ancestor.has_relative_path()) {
    ancestor = ancestor.parent_path();
    if (::stat(ancestor.c_str(), &st) == 0) break;
    if (errno != ENOENT) break;  // ENOTDIR: an ancestor further up is a file; found there
  }
  if (::stat(ancestor.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    refuse(flag + " " + dir + ": cannot create it: " + ancestor.string() + " is not a "
           "directory (" + std::strerror(ENOTDIR) + ")");
  }
  if (::access(ancestor.c_str(), W_OK | X_OK) != 0) {
    const int access_err = errno;
    refuse(flag + " " + dir + ": cannot create it in " + ancestor.string() + ": " +
           std::strerror(access_err));
  }
}

}  // namespace kiln::apps
