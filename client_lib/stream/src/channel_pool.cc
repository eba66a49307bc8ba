// ChannelPool: see straggler/stream/channel_pool.h.
#include "straggler/stream/channel_pool.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace straggler::stream {

absl::StatusOr<std::vector<std::string>> SplitEndpoints(std::string_view text) {
  // Debian's Abseil has its own string_view.
  const absl::string_view endpoints(text.data(), text.size());
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(endpoints, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "endpoint '", endpoints,
          "' has an empty address (one address, or several separated by commas)"));
    }
    out.emplace_back(part);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ChannelPool>> ChannelPool::Make(
    std::string_view endpoints, std::shared_ptr<grpc::ChannelCredentials> credentials,
    grpc::ChannelArguments args) {
  absl::StatusOr<std::vector<std::string>> list = SplitEndpoints(endpoints);
  if (!list.ok()) return list.status();
  return std::shared_ptr<ChannelPool>(
      new ChannelPool(*std::move(list), std::move(credentials), std::move(args)));
}

std::shared_ptr<grpc::Channel> ChannelPool::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (!ch) ch = grpc::CreateCustomChannel(address, credentials_, args_);
  return ch;
}

}  // namespace straggler::stream
