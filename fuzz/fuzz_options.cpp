// libFuzzer target for the option parser and the config-file reader of `mfattn run`.
//
// Input: the bytes before the first NUL are the command line, split at whitespace into words;
// the bytes after it (if any) are the text of a config file, given as --config. The text is
// also parsed on its own through parse_config_text. A UsageError is the expected outcome of
// bad input; any other exception, a crash, a sanitizer report or a hang is a finding.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "mfattn/app/config.hpp"
#include "mfattn/app/run_resources.hpp"

namespace {

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (const char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string path = "/tmp/mfattn-fuzz-" + std::to_string(::getpid());
    ::mkdir(path.c_str(), 0700);
    return path;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto nul = input.find('\0');
  std::vector<std::string> args = split_words(input.substr(0, nul));
  if (args.size() > 64) args.resize(64);
  if (nul != std::string::npos) {
    const std::string text = input.substr(nul + 1);
    mfattn::RunConfig scratch;
    const auto table = mfattn::run_options(scratch);
    try {
      (void)mfattn::parse_config_text(text, "fuzz.ini", table);
    } catch (const mfattn::UsageError&) {
    }
    const std::string path = scratch_dir() + "/fuzz.ini";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    try {
      std::string read;
      (void)mfattn::read_config_file(path, table, read);
    } catch (const mfattn::UsageError&) {
    }
    args.insert(args.end(), {"--config", path});
  }
  bool has_out = false;
  for (const auto& word : args) has_out = has_out || word.rfind("--out", 0) == 0;
  if (!has_out) args.insert(args.end(), {"--out", scratch_dir() + "/out.h5"});
  try {
    const mfattn::RunConfig cfg = mfattn::parse_run_arguments(args);
    (void)mfattn::estimated_memory_bytes(cfg);
  } catch (const mfattn::UsageError&) {
  }
  return 0;
}
