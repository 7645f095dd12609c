#include "common/status.h"

#include <cstring>

namespace loom {

const char* codeName(Code code) {
  switch (code) {
    case Code::kSuccess: return "success";
    case Code::kCudaError: return "unhandled cuda error";
    case Code::kSystemError: return "system error";
    case Code::kInternalError: return "internal error";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kInvalidUsage: return "invalid usage";
    case Code::kRemoteError: return "remote error";
    case Code::kInProgress: return "in progress";
  }
  return "unknown code";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kSuccess) {
    rep_ = std::make_shared<Rep>(Rep{code, std::move(message), {}});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::toString() const {
  if (!rep_) return "success";
  std::string s = rep_->message;
  if (!rep_->trail.empty()) s += " [" + rep_->trail + "]";
  return s;
}

Status& Status::addTrail(const char* file, int line) {
  if (!rep_) return *this;
  const char* base = std::strrchr(file, '/');
  std::string site = std::string(base ? base + 1 : file) + ":" + std::to_string(line);
  if (rep_.use_count() > 1) rep_ = std::make_shared<Rep>(*rep_);
  if (!rep_->trail.empty()) rep_->trail += " < ";
  rep_->trail += site;
  return *this;
}

Status& Status::addContext(std::string_view context) {
  if (!rep_) return *this;
  if (rep_.use_count() > 1) rep_ = std::make_shared<Rep>(*rep_);
  rep_->message = std::string(context) + ": " + rep_->message;
  return *this;
}

Status invalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
Status invalidUsage(std::string m) { return Status(Code::kInvalidUsage, std::move(m)); }
Status systemError(std::string m) { return Status(Code::kSystemError, std::move(m)); }
Status internalError(std::string m) { return Status(Code::kInternalError, std::move(m)); }
Status remoteError(std::string m) { return Status(Code::kRemoteError, std::move(m)); }

std::string errnoText(int err) {
  char buf[128];
  // GNU strerror_r returns the string (which may not be buf).
  const char* text = strerror_r(err, buf, sizeof buf);
  return std::string(text) + " (errno " + std::to_string(err) + ")";
}

Status abortedError(std::string_view what) {
  return Status(Code::kInvalidUsage, "the communicator was aborted while " + std::string(what));
}

Status systemErrno(std::string_view what, int err) {
  return Status(Code::kSystemError, std::string(what) + ": " + errnoText(err));
}

}  // namespace loom
