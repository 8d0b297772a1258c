// Disk space and write errors, so that a full disk ends a run with a message that names the path
// and the bytes needed instead of a file silently left short or empty.
#pragma once

#include <cstdint>
#include <string>

#include "core/bytes.h"

namespace primus::safe {

// Bytes an unprivileged writer may still use on the file system holding `path` (statvfs's
// f_bavail); `path` may be a file or folder that does not exist yet (its nearest existing parent
// is asked). Throws primus::Error when no parent can be asked.
uint64_t free_bytes(const std::string& path);

// Throws primus::Error ("not enough space ... need N bytes, M free") unless the file system holding
// `path` has at least `bytes` free. `what` says what was about to be written ("checkpoint shard").
// PRIMUS_FAULT_DISK_FREE=<bytes> pretends that only that much is free (fault-injection tests).
void require_free(const std::string& path, uint64_t bytes, const std::string& what);

// "No space left on device (ENOSPC)" and friends as one message: `verb` the path, bytes needed.
[[noreturn]] void fail_write(const std::string& path, int err, uint64_t bytes_needed);

// Bytes in human form ("3.2 MiB") for messages: core/bytes.h.
using primus::human_bytes;

}  // namespace primus::safe
