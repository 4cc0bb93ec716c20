// regions.h: a system too large for one pass, evaluated region by region
// (Engine::compute(SystemView), see engine.h).
//
// The system is cut along its lattice directions (periodic ones in fractional
// coordinates, open ones over the atoms' extent) into a grid of regions. Each
// region is evaluated as a system of its own: its atoms (the owners of their
// energy) followed by ghosts, every atom or periodic image within `depth` =
// num_layers x cutoff of the region. A message-passing model's energy of atom i
// depends only on atoms reached in num_layers hops of at most one cutoff each,
// and every atom within num_layers - 1 hops of i has its whole neighborhood among
// the ghosts, so the owned energies are exact; so are their gradients with respect
// to every position, which are summed into the atoms the ghosts are copies of.
// The price is the ghosts' work; the gain is that the node tensors of one region,
// not of the whole system, are held at a time.
//
// Along a cut direction the region system is open (ghost images are explicit
// atoms); directions that are not cut keep their periodicity and cell vector.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "e3fuse/system.h"
#include "neighbors/lattice.h"

namespace e3fuse {

struct RegionGrid {
  int count[3] = {1, 1, 1};
  int total() const { return count[0] * count[1] * count[2]; }
};

// One region as a system: owned atoms [0, num_owned) in the whole system's order,
// then ghosts. atom[i] is the index in the whole system of region atom i.
struct Region {
  std::vector<double> positions;  // num_atoms x 3
  std::vector<int32_t> species;
  std::vector<int64_t> atom;
  int64_t num_owned = 0;
  // Ghosts come in shells: shell s >= 1 holds those whose distance from the region (along
  // each cut direction, a lower bound of the distance to its atoms) is at most s cutoffs.
  // layer_rows[t]: atoms in shells 0 .. num_layers - 1 - t, those whose layer-t features
  // reach an owned energy (see GraphView::layer_rows).
  std::vector<int64_t> layer_rows;
  double cell[9] = {};
  bool pbc[3] = {false, false, false};
  int64_t num_atoms() const { return static_cast<int64_t>(atom.size()); }
};

class RegionSplitter {
 public:
  // Ghosts reach num_layers x cutoff (Angstrom) from a region.
  RegionSplitter(const SystemView& system, double cutoff, int num_layers);

  // The grid with the least total work (owned + ghost atoms, estimated from a
  // uniform density) whose regions hold at most max_atoms atoms each; when none does,
  // the one with the fewest atoms per region ({1, 1, 1} where cuts only add ghosts).
  // {1, 1, 1} when the whole system fits.
  RegionGrid choose(int64_t max_atoms) const;
  // Estimated atoms (owned + ghosts) of one region of the grid.
  double estimated_region_atoms(const RegionGrid& grid) const;

  void make(const RegionGrid& grid, int index, Region& region) const;
  int64_t num_atoms() const { return system_.num_atoms; }

 private:
  // The fraction of direction a's extent that a region and its ghosts span.
  double span(int a, int count) const;

  SystemView system_;
  lattice::Lattice lattice_;
  double cutoff_;
  int num_layers_;
  double scale_[3] = {};       // Angstrom per unit of each direction's coordinate
  std::vector<double> unit_;   // per atom and direction: coordinate in [0, 1) of the extent
  std::vector<int32_t> wrap_;  // per atom and periodic direction: the integer wrap taken off
  double ghost_[3] = {};       // depth as a fraction of each direction's extent
};

// An error message from one region's evaluation with its atom indices rewritten
// to the whole system's ("atom 12", "atoms 3 and 40").
std::string region_message(const std::string& message, const Region& region);

}  // namespace e3fuse
