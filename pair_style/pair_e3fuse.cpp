/* pair_style e3fuse: see pair_e3fuse.h for the syntax and the three ways of
   handling message passing (per-layer exchange, a thick ghost shell, images). */

#include "pair_e3fuse.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "e3fuse/engine.h"
#include "e3fuse/error.h"
#include "e3fuse/model.h"
#include "e3fuse/system.h"
#include "e3fuse_mpi_exchange.h"
#include "error.h"
#include "force.h"
#include "memory.h"
#include "neigh_list.h"
#include "neighbor.h"
#include "platform.h"
#include "update.h"
#include "utils.h"

using namespace LAMMPS_NS;

namespace {

// Element symbols by atomic number (index 0 unused).
const char *const kElementSymbols[] = {
    "",   "H",  "He", "Li", "Be", "B",  "C",  "N",  "O",  "F",  "Ne", "Na", "Mg", "Al", "Si",
    "P",  "S",  "Cl", "Ar", "K",  "Ca", "Sc", "Ti", "V",  "Cr", "Mn", "Fe", "Co", "Ni", "Cu",
    "Zn", "Ga", "Ge", "As", "Se", "Br", "Kr", "Rb", "Sr", "Y",  "Zr", "Nb", "Mo", "Tc", "Ru",
    "Rh", "Pd", "Ag", "Cd", "In", "Sn", "Sb", "Te", "I",  "Xe", "Cs", "Ba", "La", "Ce", "Pr",
    "Nd", "Pm", "Sm", "Eu", "Gd", "Tb", "Dy", "Ho", "Er", "Tm", "Yb", "Lu", "Hf", "Ta", "W",
    "Re", "Os", "Ir", "Pt", "Au", "Hg", "Tl", "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac",
    "Th", "Pa", "U",  "Np", "Pu", "Am", "Cm", "Bk", "Cf", "Es", "Fm", "Md", "No", "Lr", "Rf",
    "Db", "Sg", "Bh", "Hs", "Mt", "Ds", "Rg", "Cn", "Nh", "Fl", "Mc", "Lv", "Ts", "Og"};
constexpr int kNumElements = 118;

// Atomic number of an element symbol (exact, case-sensitive), or 0.
int atomic_number(const std::string &symbol) {
  for (int z = 1; z <= kNumElements; ++z)
    if (symbol == kElementSymbols[z]) return z;
  return 0;
}

std::string element_symbol(int z) {
  if (z >= 1 && z <= kNumElements) return kElementSymbols[z];
  return "Z=" + std::to_string(z);
}

std::string format_double(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

// How comm exchange's node rows of a GPU engine reach MPI (the log's words, at setup and in
// the timing summary).
std::string gpu_rows_route(bool device_rows) {
  return device_rows ? "sent from GPU memory (CUDA-aware MPI)"
                     : "staged through pinned host memory";
}

}  // namespace

/* ---------------------------------------------------------------------- */

PairE3fuse::PairE3fuse(LAMMPS *lmp) : Pair(lmp) {
  single_enable = 0;
  restartinfo = 0;
  one_coeff = 1;
  manybody_flag = 1;
  unit_convert_flag = 0;
  // the engine returns the virial (an exact strain derivative); no f.r sum
  no_virial_fdotr_compute = 1;
  // per-atom virials split every edge term half-half: not the centroid form
  centroidstressflag = CENTROID_NOTAVAIL;
  ghostneigh = 0;
  cutghost = nullptr;
  comm_forward = comm_reverse = 0;
  exchange_ = std::make_unique<E3fuseMpiExchange>(world);
}

/* ---------------------------------------------------------------------- */

PairE3fuse::~PairE3fuse() {
  if (copymode) return;
  if (allocated) {
    memory->destroy(setflag);
    memory->destroy(cutsq);
    memory->destroy(cutghost);
  }
}

/* ---------------------------------------------------------------------- */

void PairE3fuse::allocate() {
  allocated = 1;
  const int n = atom->ntypes;
  memory->create(setflag, n + 1, n + 1, "pair:setflag");
  memory->create(cutsq, n + 1, n + 1, "pair:cutsq");
  memory->create(cutghost, n + 1, n + 1, "pair:cutghost");
  for (int i = 0; i <= n; ++i)
    for (int j = 0; j <= n; ++j) {
      setflag[i][j] = 0;
      cutsq[i][j] = 0.0;
      cutghost[i][j] = 0.0;
    }
}

/* ----------------------------------------------------------------------
   pair_style e3fuse [device cpu|cuda|cuda:N] [precision float32|float64] [threads N]
                     [comm auto|exchange|shell|images]   (`mode`: the same as `comm`)
                     [radial auto|mlp|table]   (radial MLP per edge or tabulated in r;
                                               "tabulated": "table" under pair_style hybrid)
                     [charge Q] [spin S]   (per-system inputs of MACE models with
                                            embedding_specs; mace's defaults 0 and 1)
                     [cuda_aware auto|yes|no]   (comm exchange on a GPU: rows sent from GPU
                                                 memory by a CUDA-aware MPI library)
------------------------------------------------------------------------- */

void PairE3fuse::settings(int narg, char **arg) {
  if (strcmp(update->unit_style, "metal") != 0)
    error->all(FLERR, "pair_style e3fuse requires 'units metal' (eV, Angstrom, ps), not 'units {}'",
               update->unit_style);

  // what the engine was built with: a pair_style that changes only charge, spin or comm
  // keeps it (and its radial tables), switched to the new per-system inputs
  const std::string old_device = device_name_, old_precision = precision_name_,
                    old_radial = radial_name_;
  const int old_gpu = gpu_index_, old_threads = num_threads_;
  device_name_ = "cpu";
  gpu_index_ = -1;
  precision_name_.clear();
  radial_name_ = "auto";
  num_threads_ = 0;
  mode_requested_ = Mode::AUTO;
  cuda_aware_ = "auto";
  system_inputs_.clear();

  int iarg = 0;
  while (iarg < narg) {
    const std::string key = arg[iarg];
    if (iarg + 1 >= narg) error->all(FLERR, "pair_style e3fuse: keyword '{}' needs a value", key);
    const std::string value = arg[iarg + 1];
    if (key == "device") {
      try {
        device_name_ = e3fuse::to_string(e3fuse::parse_device(value));
        gpu_index_ = e3fuse::parse_gpu_index(value);
      } catch (std::exception &e) {
        error->all(FLERR, "pair_style e3fuse: {}", e.what());
      }
    } else if (key == "precision") {
      try {
        precision_name_ = e3fuse::to_string(e3fuse::parse_precision(value));
      } catch (std::exception &e) {
        error->all(FLERR, "pair_style e3fuse: {}", e.what());
      }
    } else if (key == "radial") {
      // "tabulated": the same as "table", which pair_style hybrid would take for
      // the name of LAMMPS's pair_style table and start a sub-style there
      try {
        radial_name_ =
            e3fuse::to_string(e3fuse::parse_radial(value == "tabulated" ? "table" : value));
      } catch (std::exception &e) {
        error->all(FLERR, "pair_style e3fuse: {}", e.what());
      }
    } else if (key == "threads") {
      num_threads_ = utils::inumeric(FLERR, value, false, lmp);
      if (num_threads_ < 0)
        error->all(FLERR, "pair_style e3fuse: threads must be >= 0 (0: OpenMP default)");
    } else if (key == "cuda_aware") {
      if (value != "auto" && value != "yes" && value != "no")
        error->all(FLERR, "pair_style e3fuse: cuda_aware '{}' (expected auto, yes or no)", value);
      cuda_aware_ = value;
    } else if (key == "charge" || key == "spin") {
      system_inputs_[key] = utils::numeric(FLERR, value, false, lmp);
    } else if (key == "comm" || key == "mode") {
      if (value == "auto")
        mode_requested_ = Mode::AUTO;
      else if (value == "images")
        mode_requested_ = Mode::IMAGES;
      else if (value == "shell")
        mode_requested_ = Mode::SHELL;
      else if (value == "exchange")
        mode_requested_ = Mode::EXCHANGE;
      else
        error->all(FLERR,
                   "pair_style e3fuse: unknown {} '{}' (expected auto, exchange, shell or images)",
                   key, value);
    } else {
      error->all(
          FLERR,
          "pair_style e3fuse: unknown keyword '{}' (expected device, precision, threads, comm, "
          "radial, charge, spin or cuda_aware)",
          key);
    }
    iarg += 2;
  }
  if (precision_name_.empty()) precision_name_ = device_name_ == "cpu" ? "float64" : "float32";

  if (engine_ && device_name_ == old_device && gpu_index_ == old_gpu &&
      precision_name_ == old_precision && radial_name_ == old_radial &&
      num_threads_ == old_threads) {
    try {
      const std::vector<double> values = system_input_values(*model_);
      if (!values.empty()) engine_->set_system_inputs(values);
    } catch (std::exception &e) {
      error->all(FLERR, "pair e3fuse: model '{}': {}", model_path_, e.what());
    }
    return;
  }
  // other settings invalidate the engine: pair_coeff must follow
  engine_.reset();
  model_.reset();
}

/* ----------------------------------------------------------------------
   The GPU of this rank: "device cuda:N" as given; "device cuda" with several
   GPUs visible: the rank's index among the ranks of its node, modulo the GPUs.
------------------------------------------------------------------------- */

int PairE3fuse::choose_gpu() {
  if (device_name_ == "cpu") return -1;
  if (gpu_index_ >= 0) return gpu_index_;
  // The split is collective: every rank takes it, whatever GPUs its own node has.
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, comm->me, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  const int count = e3fuse::cuda_device_count();
  if (count <= 1) return -1;
  const int gpu = local_rank % count;
  if (comm->me == 0)
    utils::logmesg(lmp,
                   "pair e3fuse: {} GPUs per node, {} ranks on rank 0's node: rank r uses GPU "
                   "(local rank mod {})\n",
                   count, local_size, count);
  return gpu;
}

/* ----------------------------------------------------------------------
   A model with per-system inputs (MACE embedding_specs: total charge and spin) with
   the values of the pair_style keywords of the same names (ASE's atoms.info keys),
   mace's defaults for those not given; a keyword the model has no input for is an error.
------------------------------------------------------------------------- */

std::vector<double> PairE3fuse::system_input_values(const e3fuse::Model &model) {
  const std::vector<e3fuse::Model::SystemInput> inputs = model.system_inputs();
  for (const auto &kv : system_inputs_) {
    bool known = false;
    for (const auto &in : inputs) known = known || in.key == kv.first;
    if (!known)
      throw std::runtime_error("pair_style keyword '" + kv.first +
                               "' given, but the model has no such per-system input");
  }
  std::vector<double> values;
  std::string used;
  for (const auto &in : inputs) {
    const auto given = system_inputs_.find(in.key);
    values.push_back(given != system_inputs_.end() ? given->second : in.default_value);
    used += " " + in.key + " " + std::to_string(values.back()) +
            (given != system_inputs_.end() ? "" : " (default)");
  }
  if (!values.empty() && comm->me == 0)
    utils::logmesg(lmp, "pair e3fuse: per-system inputs:" + used + "\n");
  return values;
}

std::shared_ptr<const e3fuse::Model> PairE3fuse::with_system_inputs(
    std::shared_ptr<const e3fuse::Model> model) {
  const std::vector<double> values = system_input_values(*model);
  return values.empty() ? model : model->with_system_inputs(values);
}

/* ----------------------------------------------------------------------
   What identifies the model file's contents for reuse (size and modification time).
------------------------------------------------------------------------- */

std::string PairE3fuse::file_stamp(const std::string &path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) return "";
  const auto time = std::filesystem::last_write_time(path, error);
  if (error) return "";
  return std::to_string(size) + "@" + std::to_string(time.time_since_epoch().count());
}

/* ----------------------------------------------------------------------
   pair_coeff * * model.e3f El1 El2 ... (one element or NULL per atom type)
------------------------------------------------------------------------- */

void PairE3fuse::coeff(int narg, char **arg) {
  const int ntypes = atom->ntypes;
  if (narg != 3 + ntypes)
    error->all(FLERR,
               "pair_coeff for e3fuse: expected '* * model.e3f' and {} element symbol(s) or NULL "
               "(one per atom type), got {} argument(s)",
               ntypes, narg);
  if (strcmp(arg[0], "*") != 0 || strcmp(arg[1], "*") != 0)
    error->all(FLERR, "pair_coeff for e3fuse must start with '* *'");
  if (!allocated) allocate();

  // the engine kept by pair_style (its settings unchanged, per-system inputs switched)
  // serves the same, unchanged file; any other pair_coeff loads the model
  const std::string stamp = file_stamp(arg[2]);
  const bool reuse = engine_ && model_path_ == arg[2] && !stamp.empty() && stamp == model_stamp_;
  model_path_ = arg[2];
  if (reuse) {
    if (comm->me == 0)
      utils::logmesg(lmp, "pair e3fuse: model " + model_path_ + " unchanged: engine reused\n");
  } else {
    const int gpu = choose_gpu();
    try {
      engine_.reset();  // the old engine's memory (GPU) before the new one's
      model_ = with_system_inputs(e3fuse::Model::load(model_path_));
      engine_ = std::make_unique<e3fuse::Engine>(
          model_, e3fuse::parse_device(device_name_), e3fuse::parse_precision(precision_name_),
          num_threads_, gpu, e3fuse::parse_radial(radial_name_));
      model_stamp_ = stamp;
    } catch (std::exception &e) {
      engine_.reset();
      model_.reset();
      error->all(FLERR, "pair e3fuse: cannot use model '{}': {}", model_path_, e.what());
    }
  }
  cutoff_ = model_->cutoff();
  num_layers_ = model_->num_layers();
  if (!(cutoff_ > 0.0) || num_layers_ < 1)
    error->all(FLERR, "pair e3fuse: model '{}' has cutoff {} and {} layers", model_path_, cutoff_,
               num_layers_);

  type_species_.assign(ntypes + 1, -1);
  type_elements_.assign(ntypes + 1, "NULL");
  for (int t = 1; t <= ntypes; ++t) {
    const std::string symbol = arg[2 + t];
    type_elements_[t] = symbol;
    if (symbol == "NULL") continue;
    const int z = atomic_number(symbol);
    if (z == 0)
      error->all(FLERR, "pair_coeff for e3fuse: '{}' (atom type {}) is not an element symbol",
                 symbol, t);
    const int s = model_->species_of(z);
    if (s < 0) {
      std::string known;
      for (int zz : model_->atomic_numbers())
        known += (known.empty() ? "" : " ") + element_symbol(zz);
      error->all(FLERR,
                 "pair_coeff for e3fuse: element {} (atom type {}) is not in the model '{}' (it "
                 "knows: {})",
                 symbol, t, model_path_, known);
    }
    type_species_[t] = s;
  }
  // Types mapped to NULL: as a sub-style of pair_style hybrid (force->pair is
  // the hybrid style) they stay unset, so that hybrid hands them to other styles
  // and leaves them out of our neighbor list; alone, they are set, and an atom of
  // such a type is an error in compute().
  const bool substyle = force->pair != this;
  for (int i = 1; i <= ntypes; ++i)
    for (int j = i; j <= ntypes; ++j)
      setflag[i][j] = (!substyle || (type_species_[i] >= 0 && type_species_[j] >= 0)) ? 1 : 0;

  if (comm->me == 0) {
    std::string mapping;
    for (int t = 1; t <= ntypes; ++t)
      mapping += (t > 1 ? ", " : "") + std::to_string(t) + " -> " + type_elements_[t];
    utils::logmesg(lmp, "pair e3fuse: model " + model_path_ + "\n  " + engine_->describe() +
                            "\n  atom types: " + mapping + "\n  e3fuse version " +
                            e3fuse::version() + "\n");
  }
}

/* ---------------------------------------------------------------------- */

void PairE3fuse::init_style() {
  if (strcmp(update->unit_style, "metal") != 0)
    error->all(FLERR, "pair_style e3fuse requires 'units metal', not 'units {}'",
               update->unit_style);
  if (!engine_)
    error->all(FLERR, "pair e3fuse: pair_coeff * * model.e3f ... must be given after pair_style");

  mode_ = mode_requested_;
  if (mode_ == Mode::AUTO) mode_ = comm->nprocs == 1 ? Mode::IMAGES : Mode::EXCHANGE;
  const char *mode_name = mode_ == Mode::IMAGES  ? "images"
                          : mode_ == Mode::SHELL ? "shell"
                                                 : "exchange";
  if (mode_ == Mode::IMAGES) {
    if (comm->nprocs != 1)
      error->all(FLERR,
                 "pair e3fuse: comm images needs a single MPI rank (this run has {}); use comm "
                 "exchange",
                 comm->nprocs);
  } else {
    if (force->newton_pair == 0)
      error->all(FLERR,
                 "pair e3fuse in comm {} (the default with several MPI ranks is exchange) "
                 "requires newton_pair on",
                 mode_name);
    if (comm->mode != Comm::SINGLE)
      error->all(FLERR, "pair e3fuse (comm {}) requires comm_modify mode single", mode_name);
  }
  // exchange: LAMMPS's forward communication carries each atom's owner (2 values) once per
  // reneighboring; the node rows travel through e3fuse's own exchange
  comm_forward = (mode_ == Mode::EXCHANGE) ? 2 : 0;
  comm_reverse = 0;

  graph_logged_ = false;
  graph_current_ = false;
  ghostneigh = (mode_ == Mode::SHELL) ? 1 : 0;
  // Under pair_style hybrid or hybrid/overlay, LAMMPS sizes its communication
  // buffers (Comm::init) and ghost neighbor cutoffs (Neighbor::init) from the
  // hybrid style's comm_forward, comm_reverse and ghostneigh, which hybrid copied
  // from its sub-styles at pair_style time, before pair_coeff loaded our model:
  // the halo width was 0 then, and a halo exchange overran the buffers. Both run
  // after this init_style, so raising the hybrid style's values here suffices.
  if (force->pair != this) {
    Pair *hybrid = force->pair;
    hybrid->comm_forward = std::max(hybrid->comm_forward, comm_forward);
    hybrid->comm_reverse = std::max(hybrid->comm_reverse, comm_reverse);
    if (ghostneigh) hybrid->ghostneigh = 1;
  }
  if (mode_ == Mode::SHELL) {
    neighbor->add_request(this, NeighConst::REQ_FULL | NeighConst::REQ_GHOST);
  } else {
    // no LAMMPS neighbor list: the engine finds the edges itself (images: over the periodic
    // box; exchange: over the local and ghost atoms), with LAMMPS's skin
    try {
      engine_->set_neighbor_skin(neighbor->skin);
    } catch (std::exception &e) {
      error->all(FLERR, "pair e3fuse: {}", e.what());
    }
  }

  if (mode_ == Mode::SHELL) {
    // An atom's energy depends on atoms num_layers hops away: the ghost shell
    // must reach num_layers x cutoff, plus the skin (atoms move between
    // neighbor list builds).
    const double needed = num_layers_ * cutoff_ + neighbor->skin;
    const bool raised = comm->cutghostuser < needed;
    if (raised) comm->cutghostuser = needed;
    if (comm->me == 0)
      utils::logmesg(
          lmp, "pair e3fuse: comm shell; ghost cutoff " + format_double(comm->cutghostuser) + " A" +
                   (raised ? " (set to " : " (>= ") + std::to_string(num_layers_) + " layers x " +
                   format_double(cutoff_) + " A + skin " + format_double(neighbor->skin) + " A)\n");
  } else if (mode_ == Mode::EXCHANGE) {
    // CUDA-aware MPI (the library's own answer, at run time): rows straight from GPU memory
    const bool gpu = device_name_ != "cpu";
    const bool cuda_mpi = gpu && cuda_aware_ != "no" && E3fuseMpiExchange::mpi_supports_cuda();
    if (gpu && cuda_aware_ == "yes" && !cuda_mpi)
      error->all(FLERR,
                 "pair e3fuse: cuda_aware yes, but this MPI library does not report CUDA "
                 "support (MPIX_GPU_query_support / MPIX_Query_cuda_support); use cuda_aware "
                 "auto or no");
    exchange_->set_device_rows(cuda_mpi);
    std::string rows = "in host memory (device cpu)";
    if (gpu) {
      rows = gpu_rows_route(cuda_mpi);
      if (!cuda_mpi)
        rows += cuda_aware_ == "no" ? " (cuda_aware no)"
                                    : " (this MPI library does not report CUDA support)";
    }
    if (comm->me == 0)
      utils::logmesg(
          lmp,
          "pair e3fuse: comm exchange; ghosts one cutoff + skin thick, node features "
          "({} values per atom) exchanged with the neighbor ranks before each of the "
          "last {} layers, their adjoints after each (periodic images of a rank's "
          "own atoms kept by the engine); rows {}\n",
          engine_->halo_width(), num_layers_ - 1,
          rows);
  } else if (comm->me == 0) {
    utils::logmesg(
        lmp,
        "pair e3fuse: comm images (one rank; the engine's own neighbor list over the local "
        "atoms and their periodic images, skin " +
            format_double(neighbor->skin) + " A)\n");
  }
}

/* ---------------------------------------------------------------------- */

double PairE3fuse::init_one(int i, int j) {
  // also for NULL-mapped types (setflag 0): they are an error only if present
  cutghost[i][j] = cutghost[j][i] = cutoff_;
  return cutoff_;
}

/* ----------------------------------------------------------------------
   The local atoms of the neighbor list (all local atoms, or under pair_style
   hybrid those of the types given to e3fuse) become nodes 0..inum-1, the
   energy nodes. Returns inum.
------------------------------------------------------------------------- */

int PairE3fuse::add_local_nodes() {
  const int nall = atom->nlocal + atom->nghost;
  const int inum = list->inum;
  num_local_ = inum;
  atom_node_.assign(nall, -1);
  node_atom_.resize(inum);
  for (int ii = 0; ii < inum; ++ii) {
    const int i = list->ilist[ii];
    node_atom_[ii] = i;
    atom_node_[i] = ii;
  }
  return inum;
}

/* ----------------------------------------------------------------------
   images mode (one rank): the system is the periodic box itself. The nodes are
   the local atoms of the model's types (all local atoms, or under pair_style
   hybrid those of the types given to e3fuse); the engine builds its own
   neighbor list over them with the box as the cell (on the GPU for device
   cuda) and keeps it until an atom moved more than half of LAMMPS's skin, the
   box changed or the atoms did. Ghost atoms are not used: the periodic images
   are the list's shifts, as in the ASE calculator. Nothing per edge is built
   or copied on the host.
------------------------------------------------------------------------- */

void PairE3fuse::pack_images_system(e3fuse::SystemView &system) {
  const int nlocal = atom->nlocal;
  const int *type = atom->type;
  double **x = atom->x;
  const bool substyle = force->pair != this;

  node_atom_.clear();
  species_.clear();
  positions_.clear();
  for (int i = 0; i < nlocal; ++i) {
    const int t = type[i];
    const int s = (t >= 1 && t < static_cast<int>(type_species_.size())) ? type_species_[t] : -1;
    if (s < 0) {
      if (substyle) continue;  // pair_style hybrid gives this type to another style
      error->one(FLERR,
                 "pair e3fuse: atom ID {} has atom type {}, which pair_coeff maps to NULL (no "
                 "element of the model)",
                 atom_id(i), t);
    }
    if (!std::isfinite(x[i][0]) || !std::isfinite(x[i][1]) || !std::isfinite(x[i][2]))
      error->one(FLERR, "pair e3fuse: atom ID {} has a non-finite position ({}, {}, {})",
                 atom_id(i), x[i][0], x[i][1], x[i][2]);
    node_atom_.push_back(i);
    species_.push_back(s);
    positions_.insert(positions_.end(), x[i], x[i] + 3);
  }
  num_nodes_ = static_cast<int64_t>(node_atom_.size());

  // LAMMPS's box: a = (xprd, 0, 0), b = (xy, yprd, 0), c = (xz, yz, zprd)
  const bool tilted = domain->triclinic != 0;
  std::fill(cell_, cell_ + 9, 0.0);
  cell_[0] = domain->xprd;
  cell_[3] = tilted ? domain->xy : 0.0;
  cell_[4] = domain->yprd;
  cell_[6] = tilted ? domain->xz : 0.0;
  cell_[7] = tilted ? domain->yz : 0.0;
  cell_[8] = domain->zprd;
  system.num_atoms = num_nodes_;
  system.positions = positions_.data();
  system.species = species_.data();
  system.cell = cell_;
  system.pbc[0] = domain->xperiodic != 0;
  system.pbc[1] = domain->yperiodic != 0;
  system.pbc[2] = domain->zperiodic != 0;
}

/* ----------------------------------------------------------------------
   shell mode: nodes = local atoms (energy nodes) and the ghosts within
   num_layers hops of them (breadth-first over edges shorter than the
   cutoff). Edges between two atoms num_layers hops away cannot change a local
   energy and are left out; every other edge among the nodes is kept in both
   directions, so the graph stays symmetric.
------------------------------------------------------------------------- */

void PairE3fuse::build_shell_graph() {
  const int nall = atom->nlocal + atom->nghost;
  double **x = atom->x;
  int *numneigh = list->numneigh;
  int **firstneigh = list->firstneigh;
  const double cut2 = cutoff_ * cutoff_;
  const int L = num_layers_;

  if (!list->ghost)
    error->one(FLERR, "pair e3fuse (mode shell): the neighbor list has no ghost neighbors");
  const int inum = add_local_nodes();
  hop_.assign(nall, -1);
  for (int u = 0; u < inum; ++u) hop_[node_atom_[u]] = 0;
  // breadth-first search; node_atom_ doubles as the queue
  for (size_t q = 0; q < node_atom_.size(); ++q) {
    const int i = node_atom_[q];
    const int h = hop_[i];
    if (h >= L) continue;
    const int *jlist = firstneigh[i];
    const int jnum = numneigh[i];
    for (int jj = 0; jj < jnum; ++jj) {
      const int j = jlist[jj] & NEIGHMASK;
      if (hop_[j] >= 0) continue;
      const double dx = x[j][0] - x[i][0], dy = x[j][1] - x[i][1], dz = x[j][2] - x[i][2];
      if (dx * dx + dy * dy + dz * dz >= cut2) continue;
      hop_[j] = h + 1;
      atom_node_[j] = static_cast<int>(node_atom_.size());
      node_atom_.push_back(j);
    }
  }

  num_nodes_ = static_cast<int64_t>(node_atom_.size());
  positions_.resize(3 * static_cast<size_t>(num_nodes_));
  row_offsets_.assign(static_cast<size_t>(num_nodes_) + 1, 0);
  neighbors_.clear();
  for (int64_t u = 0; u < num_nodes_; ++u) {
    const int i = node_atom_[u];
    for (int a = 0; a < 3; ++a) positions_[3 * u + a] = x[i][a];
    const int hi = hop_[i];
    const int *jlist = firstneigh[i];
    const int jnum = numneigh[i];
    for (int jj = 0; jj < jnum; ++jj) {
      const int j = jlist[jj] & NEIGHMASK;
      const int hj = hop_[j];
      if (hj < 0 || std::min(hi, hj) >= L) continue;
      const double dx = x[j][0] - x[i][0], dy = x[j][1] - x[i][1], dz = x[j][2] - x[i][2];
      if (dx * dx + dy * dy + dz * dz >= cut2) continue;
      neighbors_.push_back(atom_node_[j]);
    }
    row_offsets_[u + 1] = static_cast<int64_t>(neighbors_.size());
  }
}

/* ----------------------------------------------------------------------
   exchange mode: nodes = the local atoms of the model's types (the energy
   nodes), then the ghosts of those types that can come within cutoff + skin of
   one: those within that distance of the bounding box of the local atoms. The
   engine finds the edges itself (e3fuse::NodesView): the pairs closer than
   cutoff + skin with a local atom at one end at least, with its own cell list
   on the device it runs on. Chosen when LAMMPS reneighbors, like its lists:
   until the next reneighboring no atom moves more than skin / 2, the ghosts
   and the send lists stay, and the engine keeps its edges and tests every one
   against the cutoff.
------------------------------------------------------------------------- */

void PairE3fuse::add_exchange_nodes() {
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  const int *type = atom->type;
  double **x = atom->x;
  const bool substyle = force->pair != this;
  auto species_of = [&](int i) {
    const int t = type[i];
    return (t >= 1 && t < static_cast<int>(type_species_.size())) ? type_species_[t] : -1;
  };
  node_atom_.clear();
  double lo[3] = {0.0, 0.0, 0.0}, hi[3] = {0.0, 0.0, 0.0};
  for (int i = 0; i < nlocal; ++i) {
    if (species_of(i) < 0) {
      if (substyle) continue;  // pair_style hybrid gives this type to another style
      error->one(FLERR,
                 "pair e3fuse: atom ID {} has atom type {}, which pair_coeff maps to NULL (no "
                 "element of the model)",
                 atom_id(i), type[i]);
    }
    for (int a = 0; a < 3; ++a) {
      lo[a] = node_atom_.empty() ? x[i][a] : std::min(lo[a], x[i][a]);
      hi[a] = node_atom_.empty() ? x[i][a] : std::max(hi[a], x[i][a]);
    }
    node_atom_.push_back(i);
  }
  num_local_ = static_cast<int>(node_atom_.size());
  // ghosts farther than cutoff + skin from the box of the local atoms never become
  // neighbors before the next reneighboring (under pair_style hybrid, LAMMPS's ghost shell
  // is as thick as the longest cutoff of all sub-styles)
  const double reach = cutoff_ + neighbor->skin;
  const double reach2 = reach * reach;
  for (int i = nlocal; i < nall && num_local_ > 0; ++i) {
    if (species_of(i) < 0) continue;  // an error on its owner, or another style's
    double d2 = 0.0;  // squared distance from the box
    for (int a = 0; a < 3; ++a) {
      const double d = std::max({lo[a] - x[i][a], 0.0, x[i][a] - hi[a]});
      d2 += d * d;
    }
    if (d2 < reach2) node_atom_.push_back(i);
  }
  num_nodes_ = static_cast<int64_t>(node_atom_.size());
}

void PairE3fuse::update_node_positions() {
  double **x = atom->x;
  positions_.resize(3 * static_cast<size_t>(num_nodes_));
#pragma omp parallel for num_threads(host_threads()) schedule(static)
  for (int64_t u = 0; u < num_nodes_; ++u)
    for (int a = 0; a < 3; ++a) positions_[3 * u + a] = x[node_atom_[u]][a];
}

int PairE3fuse::host_threads() const {
  return num_threads_ > 0 ? num_threads_ : omp_get_max_threads();
}

/* ----------------------------------------------------------------------
   comm exchange, at every reneighboring: who owns each ghost node, and the
   lists of the exchange that follow from it.
   1. One LAMMPS forward communication carries (rank, local index) from every
      owned atom to all its ghost copies (passed on along LAMMPS's own hops, so
      any decomposition, brick or tiled, and ghosts several ranks away work).
   2. The owners, checked here (errors name atom IDs), go to e3fuse's exchange
      (E3fuseMpiExchange::plan, e3fuse_mpi_exchange.h): ghost nodes owned by
      this rank become self images (the engine copies the owned row); of those
      owned by another rank, one per (rank, atom) is exchanged, its further
      images are self images of that one; each rank tells each owner which of
      its atoms it needs (counts by MPI_Alltoall, the local indices
      point-to-point): the send lists. It returns the new order of the ghost
      nodes, [exchanged, grouped by owner rank | self images], applied here.
------------------------------------------------------------------------- */

void PairE3fuse::find_border_nodes() {
  const int nlocal = atom->nlocal, me = comm->me, nprocs = comm->nprocs;
  ghost_owner_rank_.assign(atom->nghost, -1);
  ghost_owner_index_.assign(atom->nghost, -1);
  comm->forward_comm(this, 2);

  // owned atom -> node
  std::vector<int> owned_node(nlocal, -1);
  for (int u = 0; u < num_local_; ++u) owned_node[node_atom_[u]] = u;

  // the owner of every ghost node
  std::vector<E3fuseMpiExchange::Owner> owners;
  owners.reserve(static_cast<size_t>(num_nodes_ - num_local_));
  for (int64_t u = num_local_; u < num_nodes_; ++u) {
    const int g = node_atom_[u] - nlocal;
    const int rank = ghost_owner_rank_[g], index = ghost_owner_index_[g];
    if (rank < 0 || rank >= nprocs || index < 0)
      error->one(FLERR, "pair e3fuse: ghost atom ID {} received no owner", atom_id(node_atom_[u]));
    if (rank == me && (index >= nlocal || owned_node[index] < 0))
      error->one(FLERR, "pair e3fuse: ghost atom ID {} is an image of local atom {}, not a node",
                 atom_id(node_atom_[u]), index);
    owners.push_back({rank, index});
  }

  std::vector<int> order;
  try {
    order = exchange_->plan(num_local_, owned_node, owners);
  } catch (std::exception &e) {
    error->one(FLERR, "pair e3fuse: {}", e.what());
  }
  std::vector<int> atoms(node_atom_.begin(), node_atom_.begin() + num_local_);
  for (const int u : order) atoms.push_back(node_atom_[u]);
  node_atom_.swap(atoms);
}

/* The owner discovery (find_border_nodes): each atom's (rank, local index) as two doubles;
   a ghost passed on by a later swap sends what it received. */

int PairE3fuse::pack_forward_comm(int n, int *list_, double *buf, int /*pbc_flag*/, int * /*pbc*/) {
  const int nlocal = atom->nlocal;
  for (int k = 0; k < n; ++k) {
    const int j = list_[k];
    buf[2 * k] = j < nlocal ? comm->me : ghost_owner_rank_[j - nlocal];
    buf[2 * k + 1] = j < nlocal ? j : ghost_owner_index_[j - nlocal];
  }
  return 2 * n;
}

void PairE3fuse::unpack_forward_comm(int n, int first, double *buf) {
  const int nlocal = atom->nlocal;
  for (int k = 0; k < n; ++k) {
    ghost_owner_rank_[first + k - nlocal] = static_cast<int>(buf[2 * k]);
    ghost_owner_index_[first + k - nlocal] = static_cast<int>(buf[2 * k + 1]);
  }
}

/* ---------------------------------------------------------------------- */

void PairE3fuse::setup() {
  time_engine_ = time_graph_ = 0.0;
  exchange_->reset_counters();
  num_computes_ = 0;
}

void PairE3fuse::finish() {
  // halo exchange: the time the computation waited for it. A GPU engine reports how long its
  // device waited (the part of the exchange its convolution of interior atoms did not
  // cover); the CPU engine waits for the whole exchange (its wall time).
  const bool reports = exchange_->device_reports();
  const double wall = exchange_->seconds();
  double local[6] = {time_engine_,
                     reports ? exchange_->device_wait() : wall,
                     time_graph_,
                     exchange_->bytes_sent(),
                     wall,
                     reports ? 1.0 : 0.0},
         sum[6], most[6];
  MPI_Allreduce(local, sum, 6, MPI_DOUBLE, MPI_SUM, world);
  MPI_Allreduce(local, most, 6, MPI_DOUBLE, MPI_MAX, world);
  if (comm->me != 0 || num_computes_ == 0) return;
  const double n = comm->nprocs;
  // halo MB: node rows all ranks together sent to other ranks (through the host), forward
  // and reverse, over the run's computes; self images are the engine's and not counted
  utils::logmesg(lmp,
                 "pair e3fuse timing: engine {:.6g} s, halo exchange {:.6g} s (max over ranks "
                 "{:.6g} s), graph build {:.6g} s; {} computes; halo {:.6g} MB packed\n",
                 sum[0] / n, sum[1] / n, most[1], sum[2] / n, num_computes_, sum[3] * 1e-6);
  if (most[5] > 0.0)
    utils::logmesg(
        lmp,
        "pair e3fuse halo: exchange wall time {:.6g} s (max over ranks {:.6g} s); the GPU "
        "waited {:.6g} s for it (the halo exchange time above); overlapped with the "
        "convolution of the atoms that have no exchanged ghost among their neighbors; rows "
        "{}\n",
        sum[4] / n, most[4], sum[1] / n,
        gpu_rows_route(exchange_->takes_device_rows()));
}

/* ----------------------------------------------------------------------
   Once per run setup, rank 0 logs the size of its graph: in images and
   exchange modes the engine's neighbor list (edges within cutoff + skin), in
   shell mode the graph built from LAMMPS's list (edges within the cutoff).
------------------------------------------------------------------------- */

void PairE3fuse::log_graph(int64_t num_local, int64_t num_ghosts, int64_t num_edges) {
  if (graph_logged_ || comm->me != 0) return;
  graph_logged_ = true;
  const char *what =
      mode_ == Mode::SHELL ? " edges" : " edges (engine neighbor list, cutoff + skin)";
  utils::logmesg(lmp, "pair e3fuse: rank 0 graph: " + std::to_string(num_local) + " local atoms, " +
                          std::to_string(num_ghosts) + " ghost nodes, " +
                          std::to_string(num_edges) + what + "\n");
}

long long PairE3fuse::atom_id(int i) const {
  return atom->tag_enable ? static_cast<long long>(atom->tag[i]) : static_cast<long long>(i);
}

/* ----------------------------------------------------------------------
   The engine names atoms by graph node ("atom 12", "atoms 3 and 7"); LAMMPS
   users know them by ID.
------------------------------------------------------------------------- */

std::string PairE3fuse::with_atom_ids(const std::string &message) const {
  static const std::regex numbered(R"(\b(atoms?) (\d+)(?: and (\d+))?)");
  auto id_of = [&](const std::string &digits) {
    const long long u = std::stoll(digits);
    if (u < 0 || u >= static_cast<long long>(node_atom_.size())) return "node " + digits;
    return "ID " + std::to_string(atom_id(node_atom_[u]));
  };
  std::string out;
  auto last = message.cbegin();
  for (std::sregex_iterator it(message.begin(), message.end(), numbered), end; it != end; ++it) {
    const std::smatch &m = *it;
    out.append(last, m[0].first);
    out += m[1].str() + " " + id_of(m[2].str());
    if (m[3].matched) out += " and " + id_of(m[3].str());
    last = m[0].second;
  }
  out.append(last, message.cend());
  return out;
}

/* ---------------------------------------------------------------------- */

void PairE3fuse::check_species(int64_t num_nodes) {
  const int *type = atom->type;
  species_.resize(num_nodes);
  for (int64_t u = 0; u < num_nodes; ++u) {
    const int i = node_atom_[u];
    const int t = type[i];
    const int s = (t >= 1 && t < static_cast<int>(type_species_.size())) ? type_species_[t] : -1;
    if (s < 0)
      error->one(
          FLERR,
          "pair e3fuse: atom ID {} has atom type {}, which pair_coeff maps to NULL (no element of "
          "the model)",
          atom_id(i), t);
    species_[u] = s;
  }
}

/* ---------------------------------------------------------------------- */

void PairE3fuse::compute(int eflag, int vflag) {
  ev_init(eflag, vflag);
  if (!engine_) error->all(FLERR, "pair e3fuse: no model (pair_coeff missing)");

  const double start = platform::walltime();
  e3fuse::SystemView system;
  bool same_nodes = false;  // exchange mode between reneighborings
  if (mode_ == Mode::IMAGES) {
    pack_images_system(system);
  } else if (mode_ == Mode::SHELL) {
    build_shell_graph();
  } else if (graph_current_ && neighbor->ago > 0) {
    update_node_positions();
    same_nodes = true;
  } else {
    add_exchange_nodes();
    find_border_nodes();  // reorders the ghost nodes
    update_node_positions();
    graph_current_ = true;
  }
  time_graph_ += platform::walltime() - start;
  ++num_computes_;
  const int64_t n = num_nodes_;
  const int64_t num_local = mode_ == Mode::IMAGES ? n : num_local_;
  // in exchange mode every rank takes part in the engine's exchanges, atoms or not
  if (n == 0 && mode_ != Mode::EXCHANGE) {
    log_graph(0, 0, 0);
    return;
  }
  e3fuse::GraphView g;
  e3fuse::NodesView nodes;
  if (mode_ == Mode::SHELL) {
    check_species(n);
    g.num_nodes = n;
    g.num_energy_nodes = num_local;
    g.positions = positions_.data();
    g.species = species_.data();
    g.row_offsets = row_offsets_.data();
    g.neighbors = neighbors_.data();
  } else if (mode_ == Mode::EXCHANGE) {
    check_species(n);
    nodes.num_nodes = n;
    nodes.num_owned = num_local;
    nodes.positions = positions_.data();
    nodes.species = species_.data();
    nodes.same_nodes_as_last = same_nodes;
  }

  forces_.resize(3 * static_cast<size_t>(n));
  if (eflag_atom) atom_energies_.resize(n);
  if (vflag_atom) atom_virials_.resize(9 * static_cast<size_t>(n));
  double w[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  e3fuse::ComputeOutput out;
  out.forces = forces_.data();
  out.atom_energies = eflag_atom ? atom_energies_.data() : nullptr;
  out.virial = vflag_global ? w : nullptr;
  out.atom_virials = vflag_atom ? atom_virials_.data() : nullptr;
  const double engine_start = platform::walltime();
  try {
    if (mode_ == Mode::IMAGES)
      engine_->compute(system, out);
    else if (mode_ == Mode::EXCHANGE)
      engine_->compute(nodes, out, exchange_.get());
    else
      engine_->compute(g, out, nullptr);
  } catch (std::exception &e) {
    error->one(FLERR, "pair e3fuse: {}", with_atom_ids(e.what()));
  }
  time_engine_ += platform::walltime() - engine_start;
  if (mode_ == Mode::SHELL)
    log_graph(num_local, n - num_local, static_cast<int64_t>(neighbors_.size()));
  else
    log_graph(num_local, n - num_local, engine_->num_neighbor_edges());

  double **f = atom->f;
  for (int64_t u = 0; u < n; ++u) {
    const int i = node_atom_[u];
    f[i][0] += forces_[3 * u + 0];
    f[i][1] += forces_[3 * u + 1];
    f[i][2] += forces_[3 * u + 2];
  }
  if (eflag_global) eng_vdwl += out.energy;
  if (eflag_atom)
    for (int u = 0; u < num_local; ++u) eatom[node_atom_[u]] += atom_energies_[u];
  // engine: W = -sum_edges v (x) dE/dv, row-major 3x3 (LAMMPS sign);
  // LAMMPS: xx, yy, zz, xy, xz, yz
  if (vflag_global) {
    virial[0] += w[0];
    virial[1] += w[4];
    virial[2] += w[8];
    virial[3] += w[1];
    virial[4] += w[2];
    virial[5] += w[5];
  }
  if (vflag_atom) {
    for (int64_t u = 0; u < n; ++u) {
      const double *wu = &atom_virials_[9 * u];
      double *va = vatom[node_atom_[u]];
      va[0] += wu[0];
      va[1] += wu[4];
      va[2] += wu[8];
      va[3] += wu[1];
      va[4] += wu[2];
      va[5] += wu[5];
    }
  }
}
