/* pair_style e3fuse: equivariant interatomic potentials (SevenNet, ...) evaluated by
   the e3fuse engine (C++/CUDA). Works as a LAMMPS plugin (e3fusepairplugin.so) or
   compiled into LAMMPS (copy this file and pair_e3fuse.cpp into src/, see
   pair_style/README.md of e3fuse).

   pair_style e3fuse [device cpu|cuda] [precision float32|float64] [threads N]
                     [mode auto|images|shell]
   pair_coeff * * model.e3f Cu Ni NULL ...

   Message passing over num_layers layers makes an atom's energy depend on atoms
   up to num_layers x cutoff away. Two ways of giving the engine that neighborhood:
     images: one MPI rank. Ghost atoms are periodic images of local atoms; the
             graph has the local atoms only, with periodic shift vectors on edges
             to images. Exact, and as cheap as the ASE calculator.
     shell:  any number of ranks. The ghost shell is made num_layers x cutoff
             (+ skin) thick; the graph holds the local atoms and the ghosts within
             num_layers hops of them, only local atoms' energies count, and forces
             and per-atom virials on ghosts go back to their owners through
             LAMMPS's reverse communication (newton_pair on).
   auto (default) picks images on one rank and shell otherwise. */

#ifdef PAIR_CLASS
// clang-format off
PairStyle(e3fuse,PairE3fuse);
// clang-format on
#else

#ifndef LMP_PAIR_E3FUSE_H
#define LMP_PAIR_E3FUSE_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pair.h"

namespace e3fuse {
class Model;
class Engine;
}  // namespace e3fuse

namespace LAMMPS_NS {

class PairE3fuse : public Pair {
 public:
  PairE3fuse(class LAMMPS *);
  ~PairE3fuse() override;

  void compute(int, int) override;
  void settings(int, char **) override;
  void coeff(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;

 protected:
  int choose_gpu();
  enum class Mode { AUTO, IMAGES, SHELL };

  void allocate();
  int add_local_nodes();
  void build_images_graph();
  void build_shell_graph();
  void check_species(int64_t num_nodes);

  // settings
  std::string device_name_ = "cpu";
  int gpu_index_ = -1;          // N of "device cuda:N", -1: chosen per node-local rank
  std::string precision_name_;  // empty: float64 on cpu, float32 on cuda
  int num_threads_ = 0;
  Mode mode_requested_ = Mode::AUTO;
  Mode mode_ = Mode::IMAGES;
  bool graph_logged_ = false;  // graph size logged once per run setup

  // model and engine (from pair_coeff)
  std::string model_path_;
  std::shared_ptr<const e3fuse::Model> model_;
  std::unique_ptr<e3fuse::Engine> engine_;
  double cutoff_ = 0.0;
  int num_layers_ = 0;
  std::vector<int> type_species_;           // per LAMMPS type (1-based); -1: NULL
  std::vector<std::string> type_elements_;  // per LAMMPS type (1-based)

  // the graph handed to the engine, rebuilt at every compute()
  int64_t num_nodes_ = 0;
  std::vector<int> node_atom_;        // graph node -> LAMMPS atom index
  std::vector<int> atom_node_;        // LAMMPS atom index -> graph node or -1
  std::vector<int> hop_;              // LAMMPS atom index -> hops from a local atom (shell)
  std::vector<int> owner_of_tag_;     // atom ID -> local index (images)
  std::vector<int> ghost_owner_;      // ghost (index - nlocal) -> local index (images)
  std::vector<double> positions_;     // num_nodes x 3
  std::vector<int32_t> species_;      // num_nodes
  std::vector<int64_t> row_offsets_;  // num_nodes + 1
  std::vector<int32_t> neighbors_;    // per edge
  std::vector<int32_t> shift_index_;  // per edge (images)
  std::vector<double> shifts_;        // 3 per ghost + 1 zero entry (images)

  // engine outputs
  std::vector<double> forces_, atom_energies_, atom_virials_;
};

}  // namespace LAMMPS_NS

#endif
#endif
