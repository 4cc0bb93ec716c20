// error.cpp: the process-wide log callback declared in e3fuse/error.h.
#include "e3fuse/error.h"

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

namespace e3fuse {

namespace {

std::mutex& log_mutex() {
  static std::mutex mutex;
  return mutex;
}

LogCallback& log_callback() {
  static LogCallback callback;
  return callback;
}

}  // namespace

void set_log_callback(LogCallback callback) {
  std::lock_guard<std::mutex> lock(log_mutex());
  log_callback() = std::move(callback);
}

void log(LogLevel level, const std::string& message) {
  LogCallback callback;
  {
    std::lock_guard<std::mutex> lock(log_mutex());
    callback = log_callback();
  }
  // Called outside the lock so a callback may itself log or replace the callback.
  if (callback) {
    callback(level, message);
    return;
  }
  if (level == LogLevel::warning) {
    std::string line = "e3fuse: warning: " + message + "\n";
    std::lock_guard<std::mutex> lock(log_mutex());
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
}

}  // namespace e3fuse
