/* pair_style e3fuse: equivariant interatomic potentials (SevenNet, MACE) evaluated
   by the e3fuse engine (C++/CUDA). Works as a LAMMPS plugin (e3fusepairplugin.so)
   or compiled into LAMMPS (copy this file, pair_e3fuse.cpp and e3fuse_mpi_exchange.h/.cpp
   into src/, see pair_style/README.md of e3fuse).

   pair_style e3fuse [device cpu|cuda|cuda:N] [precision float32|float64] [threads N]
                     [comm auto|exchange|shell|images]
   pair_coeff * * model.e3f Cu Ni NULL ...

   Message passing over num_layers layers makes an atom's energy depend on atoms
   up to num_layers x cutoff away. Three ways of giving the engine that neighborhood:
     exchange: any number of ranks (the default with several). Ghosts are one
             cutoff (+ skin) thick, as for any pair style. The graph holds the
             local atoms and the ghosts; the engine finds its edges (pairs within
             cutoff + skin with a local atom at one end) with its own cell list,
             on the GPU for device cuda, when LAMMPS reneighbors and keeps them
             until it does again (skipping the edges beyond the cutoff, as in
             images mode); no LAMMPS neighbor list is requested; after every
             interaction layer the ghosts' node features are refreshed from their
             owners, and in the force pass the adjoints gathered on ghosts go back
             to the owners, by e3fuse's own exchange: ghosts that are periodic
             images of this rank's own atoms (and second images of another rank's
             atom) are copied and summed by the engine on its device; only one row
             per (other rank, atom) travels, straight from its owner with MPI
             point-to-point messages (staged through the host on the GPU). The
             owner of every ghost is found at reneighboring by one LAMMPS forward
             communication of (rank, index), so atom IDs are not needed.
     shell:  any number of ranks. The ghost shell is made num_layers x cutoff
             (+ skin) thick; the graph holds the local atoms and the ghosts within
             num_layers hops of them, and nothing is exchanged between layers.
             Much more work per rank; kept for comparison.
     images: one MPI rank (the default there). The engine evaluates the periodic
             box itself with its own neighbor list (on the GPU for device cuda),
             kept between steps with LAMMPS's skin; ghost atoms are not used.
             Exact, and as cheap as the ASE calculator.
   In exchange and shell modes, only local atoms' energies count; forces and
   per-atom virials on ghosts go back to their owners through LAMMPS's reverse
   communication (newton_pair on). `mode` is accepted as another name for `comm`. */

#ifdef PAIR_CLASS
// clang-format off
PairStyle(e3fuse,PairE3fuse);
// clang-format on
#else

#ifndef LMP_PAIR_E3FUSE_H
#define LMP_PAIR_E3FUSE_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pair.h"

namespace e3fuse {
struct SystemView;
class Model;
class Engine;
}  // namespace e3fuse

namespace LAMMPS_NS {

class E3fuseMpiExchange;

class PairE3fuse : public Pair {
 public:
  PairE3fuse(class LAMMPS *);
  ~PairE3fuse() override;

  void compute(int, int) override;
  void settings(int, char **) override;
  void coeff(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;
  void setup() override;
  void finish() override;

  // comm exchange: the owner (rank, local index) of every ghost, found at reneighboring
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;

 protected:
  int choose_gpu();
  enum class Mode { AUTO, IMAGES, SHELL, EXCHANGE };

  void allocate();
  int add_local_nodes();
  void pack_images_system(e3fuse::SystemView &system);
  void build_shell_graph();
  void add_exchange_nodes();
  void update_node_positions();
  int host_threads() const;
  void find_border_nodes();
  void check_species(int64_t num_nodes);
  void log_graph(int64_t num_local, int64_t num_ghosts, int64_t num_edges);
  long long atom_id(int i) const;  // the atom's ID (its index without IDs)
  std::string with_atom_ids(const std::string &message) const;

  // settings
  std::string device_name_ = "cpu";
  int gpu_index_ = -1;          // N of "device cuda:N", -1: chosen per node-local rank
  std::string precision_name_;  // empty: float64 on cpu, float32 on cuda
  std::string radial_name_ = "auto";
  std::map<std::string, double> system_inputs_;  // pair_style charge / spin keywords
  std::vector<double> system_input_values(const e3fuse::Model &);
  std::shared_ptr<const e3fuse::Model> with_system_inputs(std::shared_ptr<const e3fuse::Model>);
  static std::string file_stamp(const std::string &path);
  int num_threads_ = 0;
  Mode mode_requested_ = Mode::AUTO;
  // pair_style cuda_aware auto|yes|no: comm exchange's rows sent from GPU memory when the
  // MPI library is CUDA-aware (auto: when it says so; yes: an error if it does not)
  std::string cuda_aware_ = "auto";
  Mode mode_ = Mode::IMAGES;
  bool graph_logged_ = false;   // graph size logged once per run setup
  bool graph_current_ = false;  // exchange mode: the nodes of LAMMPS's current ghosts

  // model and engine (from pair_coeff)
  std::string model_path_;
  std::string model_stamp_;  // file_stamp of model_path_ when it was loaded
  std::shared_ptr<const e3fuse::Model> model_;
  std::unique_ptr<e3fuse::Engine> engine_;
  double cutoff_ = 0.0;
  int num_layers_ = 0;
  std::vector<int> type_species_;           // per LAMMPS type (1-based); -1: NULL
  std::vector<std::string> type_elements_;  // per LAMMPS type (1-based)

  // the graph handed to the engine: rebuilt at every compute() in shell mode; in exchange
  // mode its nodes, chosen at every reneighboring (graph_current_ until then: only
  // positions change), the engine finding the edges; in images mode the engine's system
  // (node_atom_, positions_, species_, cell_)
  int64_t num_nodes_ = 0;
  int num_local_ = 0;                 // nodes [0, num_local_) are local atoms (exchange, shell)
  std::vector<int> node_atom_;        // graph node -> LAMMPS atom index
  std::vector<int> atom_node_;        // LAMMPS atom index -> graph node or -1
  std::vector<int> hop_;              // LAMMPS atom index -> hops from a local atom (shell)
  std::vector<double> positions_;     // num_nodes x 3
  std::vector<int32_t> species_;      // num_nodes
  std::vector<int64_t> row_offsets_;  // num_nodes + 1
  std::vector<int32_t> neighbors_;    // per edge
  double cell_[9] = {};               // the box as lattice vectors (images)

  // engine outputs
  std::vector<double> forces_, atom_energies_, atom_virials_;

  // comm exchange, chosen at every reneighboring (find_border_nodes): the owner of every
  // LAMMPS ghost atom (filled by the forward communication), and e3fuse's own exchange
  // (e3fuse_mpi_exchange.h), which owns the per-peer lists and self images and reorders the
  // ghost nodes [exchanged, grouped by owner rank | self images]
  std::vector<int> ghost_owner_rank_, ghost_owner_index_;  // per LAMMPS ghost atom
  std::unique_ptr<E3fuseMpiExchange> exchange_;

  // seconds in this run (reset by setup(), reported by finish(); the halo exchange's time
  // and bytes sent are counted by exchange_)
  double time_engine_ = 0.0, time_graph_ = 0.0;
  bigint num_computes_ = 0;
};

}  // namespace LAMMPS_NS

#endif
#endif
