// The pair pass of unit tokens on S^2 by a k-d tree (include/mfattn/observers/observables.hpp,
// sphere_pair_statistics): the same three statistics as the m^2 / 2 pair pass, from pairs of
// tree nodes. For unit rows <x, y> > t is |x - y|^2 < 2 - 2t, so a pair of nodes whose boxes
// are nearer than the chord for every pair of points holds only close pairs (counted by the
// product of their sizes), one farther apart for every pair holds none, and only the pairs of
// nodes that straddle the chord are looked at point by point, by the pass's own predicate on
// the same inner product. A margin of 1e-8 on the squared chord (the rows are unit to 1e-9 in
// their squared norm, unit_rows) keeps every such decision one the predicate would take. The
// least inner product needs no margin: its bounds use the nodes' own norms.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "core/cluster_forests.hpp"
#include "mfattn/observers/observables.hpp"

namespace mfattn {
namespace {

constexpr std::size_t kDims = 3;
/// Points in a leaf, at most (a median split leaves 17 to 32): a leaf pair's loop is at most
/// 32 x 32 inner products.
constexpr std::size_t kLeafPoints = 32;
constexpr double kChordMargin = 1e-8;
/// The close-pair count is cut into at least this many node pairs, for the threads to share.
constexpr std::size_t kParallelPairs = 256;
/// Nodes of more points than this build their halves as separate tasks.
constexpr std::uint32_t kTaskPoints = 4096;

using Point = std::array<double, kDims>;

double inner(const Point& u, const Point& v) { return u[0] * v[0] + u[1] * v[1] + u[2] * v[2]; }

struct Node {
  std::uint32_t begin = 0, end = 0;    ///< the points [begin, end) of the tree's order
  std::int32_t left = -1, right = -1;  ///< children (-1: a leaf)
  Point low{}, high{};                 ///< the box of its points
  double least_norm2 = 0.0, largest_norm2 = 0.0;  ///< of |x|^2 over its points
  std::uint32_t size() const { return end - begin; }
  bool leaf() const { return left < 0; }
};

/// The tokens in the tree's order and the tree: each node splits its box's widest side at the
/// median point (std::nth_element, deterministic). A node's children are built as tasks: the
/// number of nodes under a node follows from its size alone (node_count), so every node's
/// place is known before it is built, and the tree is the same for every thread count.
class SphereTree {
 public:
  SphereTree(const double* x, const std::vector<std::size_t>& tokens) : points_(tokens.size()) {
    for (std::size_t a = 0; a < tokens.size(); ++a)
      for (std::size_t c = 0; c < kDims; ++c) points_[a][c] = x[tokens[a] * kDims + c];
    nodes_.resize(node_count(std::uint32_t(points_.size())));
#pragma omp parallel
#pragma omp single
    build(0, 0, std::uint32_t(points_.size()));
  }
  const std::vector<Point>& points() const { return points_; }
  const std::vector<Node>& nodes() const { return nodes_; }

  /// Squared distances between two nodes' boxes: the least and the largest over their points.
  static double least_square(const Node& a, const Node& b) {
    double sum = 0.0;
    for (std::size_t c = 0; c < kDims; ++c) {
      const double gap = std::max({0.0, b.low[c] - a.high[c], a.low[c] - b.high[c]});
      sum += gap * gap;
    }
    return sum;
  }
  static double largest_square(const Node& a, const Node& b) {
    double sum = 0.0;
    for (std::size_t c = 0; c < kDims; ++c) {
      const double span = std::max(b.high[c] - a.low[c], a.high[c] - b.low[c]);
      sum += span * span;
    }
    return sum;
  }

 private:
  /// The nodes of a subtree of `size` points: a leaf up to kLeafPoints, else the node and its
  /// two halves'.
  static std::size_t node_count(std::uint32_t size) {
    return size > kLeafPoints ? 1 + node_count(size / 2) + node_count(size - size / 2) : 1;
  }

  /// Builds the node of points [begin, end) at nodes_[index] and its subtree after it.
  void build(std::int32_t index, std::uint32_t begin, std::uint32_t end) {
    Node node{begin, end};
    node.low.fill(std::numeric_limits<double>::infinity());
    node.high.fill(-std::numeric_limits<double>::infinity());
    node.least_norm2 = std::numeric_limits<double>::infinity();
    node.largest_norm2 = 0.0;
    for (std::uint32_t a = begin; a < end; ++a) {
      for (std::size_t c = 0; c < kDims; ++c) {
        node.low[c] = std::min(node.low[c], points_[a][c]);
        node.high[c] = std::max(node.high[c], points_[a][c]);
      }
      const double norm2 = inner(points_[a], points_[a]);
      node.least_norm2 = std::min(node.least_norm2, norm2);
      node.largest_norm2 = std::max(node.largest_norm2, norm2);
    }
    if (end - begin > kLeafPoints) {
      std::size_t widest = 0;
      for (std::size_t c = 1; c < kDims; ++c)
        if (node.high[c] - node.low[c] > node.high[widest] - node.low[widest]) widest = c;
      const std::uint32_t middle = begin + (end - begin) / 2;
      std::nth_element(points_.begin() + begin, points_.begin() + middle, points_.begin() + end,
                       [widest](const Point& u, const Point& v) { return u[widest] < v[widest]; });
      node.left = index + 1;
      node.right = index + 1 + std::int32_t(node_count(middle - begin));
      // Tasks only where the halves are large: below, a task costs more than it saves.
#pragma omp task if (end - begin > kTaskPoints)
      build(node.left, begin, middle);
#pragma omp task if (end - begin > kTaskPoints)
      build(node.right, middle, end);
    }
    nodes_[std::size_t(index)] = node;
  }

  std::vector<Point> points_;
  std::vector<Node> nodes_;
};

using NodePair = std::pair<std::int32_t, std::int32_t>;

/// The pairs of nodes whose pairs of points are those of nodes a and b (a == b: the pairs
/// within), one level down, as every pass splits them: a node with itself into its halves'
/// three pairs, two nodes by the one with more points (a leaf is never split). Not for two
/// leaves.
struct ChildPairs {
  std::array<NodePair, 3> pairs{};
  std::size_t count = 0;
  const NodePair* begin() const { return pairs.data(); }
  const NodePair* end() const { return pairs.data() + count; }
};
ChildPairs child_pairs(const SphereTree& tree, std::int32_t a, std::int32_t b) {
  const Node& na = tree.nodes()[std::size_t(a)];
  const Node& nb = tree.nodes()[std::size_t(b)];
  if (a == b) return {{NodePair{na.left, na.left}, {na.right, na.right}, {na.left, na.right}}, 3};
  if (nb.leaf() || (!na.leaf() && na.size() >= nb.size()))
    return {{NodePair{na.left, b}, {na.right, b}}, 2};
  return {{NodePair{a, nb.left}, {a, nb.right}}, 2};
}

/// How the pairs of points of nodes a and b stand to a chord (squared): all within it, all
/// beyond it, or some of each (only those are looked at point by point). The margin
/// kChordMargin keeps every decision by boxes one the pass's predicate would take.
enum class Reach { None, Every, Some };
Reach reach(const Node& a, const Node& b, double chord_square) {
  if (SphereTree::least_square(a, b) > chord_square + kChordMargin) return Reach::None;
  if (SphereTree::largest_square(a, b) < chord_square - kChordMargin) return Reach::Every;
  return Reach::Some;
}

/// The pairs of points of nodes a and b (a == b: i < j within): how many.
std::int64_t pair_count(const Node& a, const Node& b, bool same) {
  return same ? std::int64_t(a.size()) * (std::int64_t(a.size()) - 1) / 2
              : std::int64_t(a.size()) * std::int64_t(b.size());
}

/// visit(i, j, <x_i, x_j>) for every pair of points of leaves a and b (a == b: i < j within),
/// in the tree's order; adds their count to work (what the tests measure).
template <class Visit>
void visit_leaf_pairs(const SphereTree& tree, std::int32_t a, std::int32_t b, std::int64_t& work,
                      Visit visit) {
  const Node& na = tree.nodes()[std::size_t(a)];
  const Node& nb = tree.nodes()[std::size_t(b)];
  const std::vector<Point>& p = tree.points();
  for (std::uint32_t i = na.begin; i < na.end; ++i)
    for (std::uint32_t j = a == b ? i + 1 : nb.begin; j < nb.end; ++j)
      visit(i, j, inner(p[i], p[j]));
  work += pair_count(na, nb, a == b);
}

/// #{i < j : <x_i, x_j> > above} over the pairs of nodes a and b (a == b: the pairs within).
std::int64_t count_close(const SphereTree& tree, std::int32_t a, std::int32_t b,
                         double chord_square, double above, std::int64_t& work) {
  const Node& na = tree.nodes()[std::size_t(a)];
  const Node& nb = tree.nodes()[std::size_t(b)];
  switch (reach(na, nb, chord_square)) {
    case Reach::None: return 0;
    case Reach::Every: return pair_count(na, nb, a == b);
    case Reach::Some: break;
  }
  std::int64_t close = 0;
  if (na.leaf() && nb.leaf()) {
    visit_leaf_pairs(tree, a, b, work,
                     [&](std::uint32_t, std::uint32_t, double value) { close += value > above; });
    return close;
  }
  for (const auto& [u, v] : child_pairs(tree, a, b))
    close += count_close(tree, u, v, chord_square, above, work);
  return close;
}

/// The pairs of nodes whose pairs of points are all the pairs of points (from the root with
/// itself), split by child_pairs until there are at least `wanted` or none can be split, so
/// that they can be counted in parallel. The split depends on the tree alone, not on the
/// thread count; the counts are integers, so their sum is exact in any order.
std::vector<NodePair> split_pairs(const SphereTree& tree, std::size_t wanted) {
  std::vector<NodePair> pairs{{0, 0}}, next;
  bool split = true;
  while (pairs.size() < wanted && split) {
    split = false;
    next.clear();
    for (const auto& [a, b] : pairs) {
      if (tree.nodes()[std::size_t(a)].leaf() && tree.nodes()[std::size_t(b)].leaf()) {
        next.emplace_back(a, b);
        continue;
      }
      split = true;
      for (const NodePair& child : child_pairs(tree, a, b)) next.push_back(child);
    }
    pairs.swap(next);
  }
  return pairs;
}

/// The cluster components: union-find over the tree's order, with each node's "whole" flag
/// (its points known to be one component), so that a pair of nodes already joined is skipped.
class ClusterJoin {
 public:
  ClusterJoin(const SphereTree& tree, double chord_square, double above, std::int64_t& work)
      : tree_(tree), forest_(tree.points().size()), whole_(tree.nodes().size(), false),
        chord_square_(chord_square), above_(above), work_(work) {}

  std::size_t components() {
    if (!tree_.nodes().empty()) join(0, 0);
    return forest_.components();
  }

 private:
  /// Every point of the node in one component (its pairs are joined, directly or through the
  /// node it was found to join whole).
  void make_whole(std::int32_t a) {
    if (whole_[std::size_t(a)]) return;
    const Node& node = tree_.nodes()[std::size_t(a)];
    for (std::uint32_t i = node.begin + 1; i < node.end; ++i) forest_.unite(node.begin, i);
    whole_[std::size_t(a)] = true;
  }
  bool joined(std::int32_t a, std::int32_t b) {
    return whole_[std::size_t(a)] && whole_[std::size_t(b)] &&
           forest_.find(tree_.nodes()[std::size_t(a)].begin) ==
               forest_.find(tree_.nodes()[std::size_t(b)].begin);
  }

  void join(std::int32_t a, std::int32_t b) {
    const Node& na = tree_.nodes()[std::size_t(a)];
    const Node& nb = tree_.nodes()[std::size_t(b)];
    if (joined(a, b) || forest_.whole()) return;
    switch (reach(na, nb, chord_square_)) {
      case Reach::None: return;
      case Reach::Every:
        make_whole(a);
        make_whole(b);
        forest_.unite(na.begin, nb.begin);
        return;
      case Reach::Some: break;
    }
    if (na.leaf() && nb.leaf()) {
      visit_leaf_pairs(tree_, a, b, work_, [&](std::uint32_t i, std::uint32_t j, double value) {
        if (value > above_) forest_.unite(i, j);
      });
      // A leaf found to be one component need not be joined again.
      if (a == b) {
        const std::uint32_t root = forest_.find(na.begin);
        bool one = true;
        for (std::uint32_t i = na.begin + 1; i < na.end && one; ++i) one = forest_.find(i) == root;
        whole_[std::size_t(a)] = one;
      }
      return;
    }
    for (const auto& [u, v] : child_pairs(tree_, a, b)) join(u, v);
    if (a == b && joined(na.left, na.right)) whole_[std::size_t(a)] = true;
  }

  const SphereTree& tree_;
  UnionFind forest_;
  std::vector<bool> whole_;
  double chord_square_, above_;
  std::int64_t& work_;
};

/// min <x_i, x_j>: the farthest pair, by branch and bound from a first guess (two sweeps: the
/// point farthest from the first, and the point farthest from that one). A pair of nodes is
/// left when even its bound cannot give a smaller inner product.
class FarthestPair {
 public:
  FarthestPair(const SphereTree& tree, std::int64_t& work) : tree_(tree), work_(work) {}

  double least_inner() {
    const std::vector<Point>& p = tree_.points();
    std::size_t far = 0;
    for (int sweep = 0; sweep < 2; ++sweep) {
      const std::size_t from = far;
      for (std::size_t j = 0; j < p.size(); ++j) {
        if (j == from) continue;  // a pair, not the point with itself
        const double value = inner(p[from], p[j]);
        if (value < lowest_) lowest_ = value, far = j;
      }
    }
    work_ += 2 * std::int64_t(p.size());
    search(0, 0);
    return lowest_;
  }

 private:
  /// The least inner product a node pair can hold, from two identities with the nodes' own
  /// norms (no unit rows assumed, so no margin beyond rounding):
  ///   <x, y> = (|x|^2 + |y|^2 - |x - y|^2) / 2 >= (least_a + least_b - D^2) / 2, tight for
  ///     near pairs (a collapsed state), D the boxes' largest distance;
  ///   <x, y> = (|x + y|^2 - |x|^2 - |y|^2) / 2 >= (R^2 - largest_a - largest_b) / 2, tight
  ///     for near-antipodal pairs (where the farthest pair of spread tokens lies, and across a
  ///     bipodal state), R the distance of a's box to b's box reflected through the origin.
  static double bound(const Node& a, const Node& b) {
    double reflected = 0.0;
    for (std::size_t c = 0; c < kDims; ++c) {
      const double gap = std::max({0.0, -b.high[c] - a.high[c], a.low[c] + b.low[c]});
      reflected += gap * gap;
    }
    return 0.5 * std::max(a.least_norm2 + b.least_norm2 - SphereTree::largest_square(a, b),
                          reflected - a.largest_norm2 - b.largest_norm2);
  }

  void search(std::int32_t a, std::int32_t b) {
    const Node& na = tree_.nodes()[std::size_t(a)];
    const Node& nb = tree_.nodes()[std::size_t(b)];
    // Left when the bound reaches the least found: a pair left holds no inner product below it
    // by more than the bound's rounding (min_inner within 1e-15 of the all-pairs pass).
    if (bound(na, nb) >= lowest_) return;
    if (na.leaf() && nb.leaf()) {
      visit_leaf_pairs(tree_, a, b, work_, [&](std::uint32_t, std::uint32_t, double value) {
        lowest_ = std::min(lowest_, value);
      });
      return;
    }
    // The children's pairs, the most promising (least bound) first.
    const ChildPairs children = child_pairs(tree_, a, b);
    const NodePair* pairs = children.begin();
    const std::size_t count = children.count;
    std::array<double, 3> bounds{};
    for (std::size_t k = 0; k < count; ++k)
      bounds[k] = bound(tree_.nodes()[std::size_t(pairs[k].first)],
                        tree_.nodes()[std::size_t(pairs[k].second)]);
    std::array<std::size_t, 3> order{0, 1, 2};
    std::sort(order.begin(), order.begin() + std::ptrdiff_t(count),
              [&](std::size_t u, std::size_t v) {
                return bounds[u] < bounds[v] || (bounds[u] == bounds[v] && u < v);
              });
    for (std::size_t k = 0; k < count; ++k) search(pairs[order[k]].first, pairs[order[k]].second);
  }

  const SphereTree& tree_;
  std::int64_t& work_;
  double lowest_ = std::numeric_limits<double>::infinity();
};

}  // namespace

PairStatistics sphere_pair_statistics(const double* x, const std::vector<std::size_t>& tokens,
                                      const ObservableSettings& settings, bool counts,
                                      std::int64_t* inner_products) {
  const std::size_t m = tokens.size();
  PairStatistics stats;
  stats.pairs = static_cast<std::int64_t>(m * (m > 0 ? m - 1 : 0) / 2);
  stats.clusters = m;
  if (m < 2) return stats;
  const SphereTree tree(x, tokens);
  // Three independent passes as tasks on the process's threads: the farthest pair, the
  // clusters' union-find (one task: its joins are sequential), and the close pairs cut into
  // node pairs (the largest pass: 0.5 to 0.9 s of a frame at 10^6 tokens). Every result is
  // exact (a least value, integer counts), so it is the same for every thread count.
  const std::vector<NodePair> close_pairs = counts ? split_pairs(tree, kParallelPairs)
                                                   : std::vector<NodePair>{};
  std::vector<std::int64_t> close(close_pairs.size(), 0), close_work(close_pairs.size(), 0);
  std::int64_t far_work = 0, join_work = 0;
  const double close_above = 1.0 - settings.pair_delta, edge_above = 1.0 - settings.cluster_delta;
#pragma omp parallel
#pragma omp single
  {
#pragma omp task shared(stats, far_work)
    stats.min_inner = FarthestPair(tree, far_work).least_inner();
    if (counts) {
#pragma omp task shared(stats, join_work)
      stats.clusters =
          ClusterJoin(tree, 2.0 * settings.cluster_delta, edge_above, join_work).components();
      for (std::size_t k = 0; k < close_pairs.size(); ++k) {
#pragma omp task shared(close, close_work, close_pairs)
        close[k] = count_close(tree, close_pairs[k].first, close_pairs[k].second,
                               2.0 * settings.pair_delta, close_above, close_work[k]);
      }
    }
  }
  if (counts) stats.close_pairs = std::accumulate(close.begin(), close.end(), std::int64_t{0});
  if (inner_products)
    *inner_products = far_work + join_work +
                      std::accumulate(close_work.begin(), close_work.end(), std::int64_t{0});
  return stats;
}

}  // namespace mfattn
