#include "regions.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "e3fuse/error.h"

namespace e3fuse {

namespace {

constexpr int kMaxCuts = 64;  // per direction
constexpr double kNoCell[9] = {};

// Coordinates within rounding of an edge of a region are still inside it.
constexpr double kGhostSlack = 1e-9;

}  // namespace

RegionSplitter::RegionSplitter(const SystemView& system, double cutoff, int num_layers)
    : system_(system),
      lattice_(lattice::make_lattice(system.cell ? system.cell : kNoCell, system.pbc)),
      cutoff_(cutoff),
      num_layers_(num_layers) {
  const double depth = cutoff * num_layers;
  const int64_t n = system.num_atoms;
  unit_.resize(3 * static_cast<size_t>(n));
  wrap_.assign(3 * static_cast<size_t>(n), 0);
  for (int a = 0; a < 3; ++a) {
    const double* r = lattice_.recip + 3 * a;
    if (lattice_.periodic[a]) {
      for (int64_t i = 0; i < n; ++i) {
        const double s = lattice::dot3(r, system.positions + 3 * i);
        double w = std::floor(s);
        double u = s - w;
        if (u >= 1.0) {  // s just below an integer, rounded up
          u = 0.0;
          w += 1.0;
        }
        if (!(std::abs(w) < lattice::kMaxWraps))
          throw Error("atom " + std::to_string(i) + " is more than 2^28 cell lengths away");
        unit_[3 * i + a] = u;
        wrap_[3 * i + a] = static_cast<int32_t>(w);
      }
      scale_[a] = lattice_.spacing[a];
      ghost_[a] = depth / scale_[a];
    } else {
      // the coordinate along the atoms' extent [lo, lo + width]
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (int64_t i = 0; i < n; ++i) {
        const double s = lattice::dot3(r, system.positions + 3 * i);
        unit_[3 * i + a] = s;
        lo = std::min(lo, s);
        hi = std::max(hi, s);
      }
      const double width = (n > 0 && hi > lo) ? hi - lo : 1.0;
      for (int64_t i = 0; i < n; ++i)
        unit_[3 * i + a] = std::min((unit_[3 * i + a] - lo) / width, std::nextafter(1.0, 0.0));
      scale_[a] = lattice_.spacing[a] * width;
      ghost_[a] = depth / scale_[a];
    }
  }
}

double RegionSplitter::span(int a, int count) const {
  if (count <= 1) return 1.0;
  const double s = 1.0 / count + 2.0 * ghost_[a];
  return lattice_.periodic[a] ? s : std::min(s, 1.0);  // periodic: images may repeat
}

double RegionSplitter::estimated_region_atoms(const RegionGrid& grid) const {
  double atoms = static_cast<double>(system_.num_atoms);
  for (int a = 0; a < 3; ++a) atoms *= span(a, grid.count[a]);
  return atoms;
}

RegionGrid RegionSplitter::choose(int64_t max_atoms) const {
  RegionGrid best;
  if (system_.num_atoms <= max_atoms) return best;
  double best_work = std::numeric_limits<double>::infinity();
  double best_atoms = std::numeric_limits<double>::infinity();
  bool fits = false;
  RegionGrid g;
  for (g.count[0] = 1; g.count[0] <= kMaxCuts; ++g.count[0]) {
    for (g.count[1] = 1; g.count[1] <= kMaxCuts; ++g.count[1]) {
      for (g.count[2] = 1; g.count[2] <= kMaxCuts; ++g.count[2]) {
        const double atoms = estimated_region_atoms(g);
        const double work = atoms * g.total();
        if (atoms <= static_cast<double>(max_atoms)) {
          if (!fits || work < best_work || (work == best_work && g.total() < best.total())) {
            best = g;
            best_work = work;
            fits = true;
          }
        } else if (!fits && atoms < best_atoms) {
          best = g;
          best_atoms = atoms;
        }
      }
    }
  }
  return best;
}

void RegionSplitter::make(const RegionGrid& grid, int index, Region& region) const {
  const int64_t n = system_.num_atoms;
  int k[3];
  k[2] = index % grid.count[2];
  k[1] = (index / grid.count[2]) % grid.count[1];
  k[0] = index / (grid.count[2] * grid.count[1]);
  bool cut[3];
  double lo[3], hi[3];
  for (int a = 0; a < 3; ++a) {
    cut[a] = grid.count[a] > 1;
    lo[a] = static_cast<double>(k[a]) / grid.count[a] - ghost_[a] - kGhostSlack;
    hi[a] = static_cast<double>(k[a] + 1) / grid.count[a] + ghost_[a] + kGhostSlack;
    region.pbc[a] = system_.pbc[a] && !cut[a];
  }
  std::copy(system_.cell ? system_.cell : kNoCell, (system_.cell ? system_.cell : kNoCell) + 9,
            region.cell);
  region.positions.clear();
  region.species.clear();
  region.atom.clear();
  auto owned = [&](int64_t i) {
    for (int a = 0; a < 3; ++a) {
      if (!cut[a]) continue;
      const int bin =
          std::min(static_cast<int>(unit_[3 * i + a] * grid.count[a]), grid.count[a] - 1);
      if (bin != k[a]) return false;
    }
    return true;
  };
  // Periodic cut directions: the copy with integer image m along a sits at
  // positions[i] + (m - wrap) cell_a, coordinate unit + m.
  auto add = [&](int64_t i, const int m[3]) {
    double x[3] = {system_.positions[3 * i], system_.positions[3 * i + 1],
                   system_.positions[3 * i + 2]};
    for (int a = 0; a < 3; ++a) {
      if (!cut[a] || !lattice_.periodic[a]) continue;
      const double shift = static_cast<double>(m[a] - wrap_[3 * i + a]);
      for (int c = 0; c < 3; ++c) x[c] += shift * lattice_.cell[3 * a + c];
    }
    region.positions.insert(region.positions.end(), x, x + 3);
    region.species.push_back(system_.species[i]);
    region.atom.push_back(i);
  };
  // a ghost's shell: its largest distance beyond the region along a cut direction, in cutoffs
  auto shell_of = [&](int64_t i, const int m[3]) {
    double d = 0.0;
    for (int a = 0; a < 3; ++a) {
      if (!cut[a]) continue;
      const double c = unit_[3 * i + a] + m[a];
      const double beyond = std::max({0.0, static_cast<double>(k[a]) / grid.count[a] - c,
                                      c - static_cast<double>(k[a] + 1) / grid.count[a]});
      d = std::max(d, beyond * scale_[a]);
    }
    return std::clamp(static_cast<int>(std::ceil(d / cutoff_)), 1, num_layers_);
  };
  struct Ghost {
    int64_t atom;
    int m[3];
  };
  std::vector<std::vector<Ghost>> shells(num_layers_ + 1);
  const int zero[3] = {0, 0, 0};
  for (int64_t i = 0; i < n; ++i)
    if (owned(i)) add(i, zero);
  region.num_owned = region.num_atoms();
  for (int64_t i = 0; i < n; ++i) {
    int first[3] = {0, 0, 0}, last[3] = {0, 0, 0};
    bool inside = true;
    for (int a = 0; a < 3 && inside; ++a) {
      if (!cut[a]) continue;
      const double u = unit_[3 * i + a];
      if (lattice_.periodic[a]) {
        first[a] = static_cast<int>(std::ceil(lo[a] - u));
        last[a] = static_cast<int>(std::floor(hi[a] - u));
      }
      inside = first[a] <= last[a] && u + first[a] >= lo[a] && u + last[a] <= hi[a];
    }
    if (!inside) continue;
    const bool is_owned = owned(i);
    int m[3];
    for (m[0] = first[0]; m[0] <= last[0]; ++m[0])
      for (m[1] = first[1]; m[1] <= last[1]; ++m[1])
        for (m[2] = first[2]; m[2] <= last[2]; ++m[2])
          if (!(is_owned && m[0] == 0 && m[1] == 0 && m[2] == 0))
            shells[shell_of(i, m)].push_back({i, {m[0], m[1], m[2]}});
  }
  std::vector<int64_t> shell_end(num_layers_ + 1, region.num_owned);
  for (int s = 1; s <= num_layers_; ++s) {
    for (const Ghost& ghost : shells[s]) add(ghost.atom, ghost.m);
    shell_end[s] = region.num_atoms();
  }
  region.layer_rows.resize(num_layers_);
  for (int t = 0; t < num_layers_; ++t) region.layer_rows[t] = shell_end[num_layers_ - 1 - t];
}

std::string region_message(const std::string& message, const Region& region) {
  std::string out;
  size_t pos = 0;
  // rewrites the number at `at` (if any) and returns the position after it
  auto rewrite = [&](size_t at) {
    size_t end = at;
    while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
    if (end == at) return at;
    const long long local = std::stoll(message.substr(at, end - at));
    out += (local >= 0 && local < region.num_atoms())
               ? std::to_string(region.atom[static_cast<size_t>(local)])
               : message.substr(at, end - at);
    return end;
  };
  while (pos < message.size()) {
    size_t hit = message.find("atom", pos);
    if (hit == std::string::npos) break;
    size_t at = hit + 4;
    if (at < message.size() && message[at] == 's') ++at;
    if (at < message.size() && message[at] == ' ') {
      ++at;
      out += message.substr(pos, at - pos);
      pos = rewrite(at);
      if (pos != at && message.compare(pos, 5, " and ") == 0) {
        out += " and ";
        pos = rewrite(pos + 5);
      }
    } else {
      out += message.substr(pos, at - pos);
      pos = at;
    }
  }
  out += message.substr(pos);
  return out;
}

}  // namespace e3fuse
