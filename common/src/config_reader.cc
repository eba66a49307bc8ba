#include "straggler/common/config_reader.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace straggler::common {
namespace {

// Where the quote that opens `line` (line[0] is ' or ") closes: the index of
// the closing quote, or npos when the line ends first. In double quotes a
// backslash escapes the next character; in single quotes '' is a quote.
size_t QuoteEnd(absl::string_view line) {
  const char quote = line[0];
  for (size_t i = 1; i < line.size(); ++i) {
    if (quote == '"' && line[i] == '\\') {
      ++i;
    } else if (line[i] == quote) {
      if (quote == '\'' && i + 1 < line.size() && line[i + 1] == '\'') {
        ++i;
      } else {
        return i;
      }
    }
  }
  return absl::string_view::npos;
}

// For a syntax error's message only (a guess, never a refusal): the first
// line, up to `last_line` (0-based; -1: every line), where a value starts
// with a quote that the line does not close. A quote starts a value at the
// start of a line or after ':', '-', '[', '{', ',' or '?' (and blanks); one
// inside a word (it's) or after '#' (a comment) does not.
std::optional<int> LineOpeningAQuote(absl::string_view text, int last_line) {
  int number = 0;
  for (absl::string_view rest = text; !rest.empty() && (last_line < 0 || number <= last_line);
       ++number) {
    const size_t eol = rest.find('\n');
    absl::string_view line = rest.substr(0, eol);
    rest = eol == absl::string_view::npos ? absl::string_view() : rest.substr(eol + 1);
    bool value_start = true;
    for (size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (c == ' ' || c == '\t' || c == '\r') continue;
      if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) break;
      if ((c == '"' || c == '\'') && value_start) {
        const size_t end = QuoteEnd(line.substr(i));
        if (end == absl::string_view::npos) return number;
        i += end;
        value_start = false;
        continue;
      }
      value_start = c == ':' || c == '-' || c == '[' || c == '{' || c == ',' || c == '?';
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<YAML::Node> ConfigReader::Load(const std::string& text) const {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string message = absl::StrCat("YAML syntax error: ", e.msg);
    if (std::optional<int> line = LineOpeningAQuote(text, e.mark.line)) {
      absl::StrAppend(&message, " (line ", *line + 1,
                      " opens a quoted value that it does not close: a missing quote?)");
    }
    return Error(e.mark, message);
  }
  size_t visited = 0;
  if (absl::Status s = CheckTree(root, text, 0, visited); !s.ok()) return s;
  return root;
}

absl::Status ConfigReader::CheckTree(const YAML::Node& node, const std::string& text, int depth,
                                     size_t& visited) const {
  // Counted with aliases expanded: that is what a loader's walk costs.
  if (++visited > kMaxConfigNodes) {
    return Error(node.Mark(),
                 absl::StrCat("the file stands for more than ", kMaxConfigNodes,
                              " YAML nodes once its aliases are expanded (an alias bomb?); a "
                              "config file has some hundreds"));
  }
  if (depth > kMaxConfigDepth) {
    return Error(node.Mark(), absl::StrCat("nested deeper than ", kMaxConfigDepth,
                                           " levels (an alias that refers to itself?)"));
  }
  if (node.IsScalar()) {
    // A quoted scalar's mark is its opening quote. yaml-cpp 0.7 takes an
    // unclosed quote's value on to the end of the file without a word.
    const YAML::Mark mark = node.Mark();
    if (mark.pos >= 0 && static_cast<size_t>(mark.pos) < text.size()) {
      const char quote = text[static_cast<size_t>(mark.pos)];
      absl::string_view from = absl::string_view(text).substr(static_cast<size_t>(mark.pos));
      if ((quote == '"' || quote == '\'') &&
          QuoteEnd(from.substr(0, from.find('\n'))) == absl::string_view::npos) {
        return Error(mark, absl::StrCat("the quoted value opened here (", std::string(1, quote),
                                        ") is not closed on this line: a missing quote? (no "
                                        "key takes a value over several lines)"));
      }
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) {
      if (absl::Status s = CheckTree(item, text, depth + 1, visited); !s.ok()) return s;
    }
  } else if (node.IsMap()) {
    std::map<std::string, int> seen;  // key -> first line (0-based)
    for (const auto& kv : node) {
      if (absl::Status s = CheckTree(kv.first, text, depth + 1, visited); !s.ok()) return s;
      if (kv.first.IsScalar()) {
        const std::string key = kv.first.Scalar();
        auto [it, fresh] = seen.emplace(key, kv.first.Mark().line);
        if (!fresh) {
          return Error(kv.first.Mark(), absl::StrCat("duplicate key '", key,
                                                     "' (first given on line ", it->second + 1,
                                                     ")"));
        }
      }
      if (absl::Status s = CheckTree(kv.second, text, depth + 1, visited); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config file ", path,
        std::filesystem::is_directory(status) ? " is a directory" : " is not a regular file",
        ", not a YAML file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status ValidateAddress(absl::string_view key, absl::string_view address,
                             bool allow_unix) {
  if (address.rfind("unix:", 0) == 0) {
    if (!allow_unix) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, "=", address, " must be HOST:PORT (no unix: sockets for HTTP)"));
    }
    if (address.size() > 5) return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, "=", address, " is not HOST:PORT (port 0 picks a free port)"));
  }
  return absl::OkStatus();
}

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::Status ValidateLogLevel(absl::string_view level) {
  for (const char* ok : {"trace", "debug", "info", "warn", "error"}) {
    if (level == ok) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log_level=", level, " is not one of trace, debug, info, warn, error"));
}

}  // namespace straggler::common
