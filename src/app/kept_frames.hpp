#pragma once
// What a writer's file keeps, frame by frame, for the last words of a command that ends early
// (docs/failure-model.md): the counts of every frame appended since the last flush, and those of
// the last frame the file keeps. A flush that meets a full disk may keep some of its frames,
// so /run and the last line on stderr speak of the last kept frame, not of the last appended
// one (`mfattn run` and `mfattn meanfield` alike). Private to src/app.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mfattn/io/h5md.hpp"

namespace mfattn {

/// The counts /run records as of one frame.
struct FrameCounts {
  double time = 0.0;
  std::int64_t step = 0, rejected = 0;
  double wall_seconds = 0.0;
};

class KeptFrames {
 public:
  /// `start`: the counts of the file's last frame before this writer appended any (a resumed
  /// file's, else t = 0 with nothing kept); `frames`: how many frames the file holds then.
  KeptFrames(const H5mdWriter& writer, FrameCounts start, std::size_t frames)
      : writer_(writer), kept_(start), kept_frames_(frames) {}

  /// After each append_frame: the counts as of that frame.
  void appended(const FrameCounts& counts) { unflushed_.push_back(counts); }

  /// After each flush, whether it succeeded or threw: takes the frames the file now holds
  /// (H5mdWriter::flushed_frames) as kept.
  void note_flushed() {
    const std::size_t now = std::min(writer_.flushed_frames(), kept_frames_ + unflushed_.size());
    if (now <= kept_frames_) return;
    kept_ = unflushed_[now - kept_frames_ - 1];
    unflushed_.erase(unflushed_.begin(), unflushed_.begin() + static_cast<std::ptrdiff_t>(now - kept_frames_));
    kept_frames_ = now;
  }

  /// The counts of the last frame the file keeps.
  const FrameCounts& kept() const { return kept_; }

 private:
  const H5mdWriter& writer_;
  std::vector<FrameCounts> unflushed_;
  FrameCounts kept_;
  std::size_t kept_frames_;
};

}  // namespace mfattn
