#include "transport/loopback/connection.h"

#include <cstring>
#include <string>

namespace loom::transport::loopback {

Status LoopbackConnection::queue(Transfer* t, Ring<Transfer*>& q) {
  if (!error_.isOk()) return error_;
  q.push(t);
  return Status::ok();
}

Status LoopbackConnection::progress() {
  if (!error_.isOk()) return error_;
  while (!sends_.empty() && !recvs_.empty()) {
    Transfer* s = sends_.front();
    Transfer* r = recvs_.front();
    if (s->bytes != r->bytes) {
      error_ = remoteError("rank " + std::to_string(self_) + " sent itself a " +
                           std::to_string(s->bytes) + "-byte message where a " +
                           std::to_string(r->bytes) +
                           "-byte receive was posted: the send and receive sides called "
                           "different collectives or counts");
      return error_;
    }
    // memmove: a caller may legitimately send a buffer into itself (in place).
    if (s->bytes > 0 && s->data != r->data) std::memmove(r->data, s->data, s->bytes);
    s->progressed = r->progressed = s->bytes;
    s->done = r->done = true;
    sends_.pop();
    recvs_.pop();
  }
  return Status::ok();
}

}  // namespace loom::transport::loopback
