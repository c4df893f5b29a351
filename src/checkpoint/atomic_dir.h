// Atomic directory commit: a checkpoint is written into a staging directory beside its final place, every file
// fsynced, the index (the metadata) written last, and the staging directory renamed into place. A rename is
// atomic, so a reader sees either the previous checkpoint or the new one, complete; a save killed midway
// leaves only the staging directory, whose name (".<name>.partial") no reader takes for a checkpoint.
#pragma once

#include <string>

namespace dtensor::checkpoint::detail {

// "<parent>/.<name>.partial" for "<parent>/<name>".
std::string staging_dir_for(const std::string& dir);
// Removes `path` (and everything under it) if it exists, then creates it empty (and its parents).
void make_empty_dir(const std::string& path);
// fsync of a file or a directory (a directory's fsync makes its entries durable).
void fsync_path(const std::string& path);
// Writes `text` to `path` and fsyncs it.
void write_file_synced(const std::string& path, const std::string& text);
// Moves `staging` to `dir` atomically: if `dir` exists the two are exchanged in one step (renameat2
// RENAME_EXCHANGE) and the old checkpoint, now at `staging`, is removed; the parent is fsynced.
void commit_dir(const std::string& staging, const std::string& dir);

}  // namespace dtensor::checkpoint::detail
