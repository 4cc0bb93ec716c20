// _core.cpp: the pybind11 module over the core. An adapter only: numpy arrays
// in, pointers to the core, numpy arrays out; e3fuse::Error -> E3fuseError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/mace.h"
#include "cpu/ops.h"
#include "cpu/pair_repulsion.h"
#include "cpu/typed_plan.h"
#include "e3fuse/engine.h"
#include "e3fuse/error.h"
#include "e3fuse/model.h"
#include "e3fuse/neighbors.h"
#include "model/plan.h"
#include "ops/radial.h"
#include "ops/radial_table.h"
#include "ops/sh.h"
#ifdef E3FUSE_WITH_CUDA
#include "cuda/probe.h"  // probe_neighbor_list_frames (gpu_neighbor_*)
#endif

namespace py = pybind11;
using namespace e3fuse;

template <class T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

namespace {

void check_shape(const py::array& a, std::vector<py::ssize_t> shape, const char* what) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(i) == shape[i];
  if (!ok) throw Error(std::string(what) + " has the wrong shape");
}

// A halo exchange within one process (tests): ghost g, node num_owned + g, is a copy of
// owned node owners[g], as a periodic image of a rank's own atom is in pair_style e3fuse
// comm exchange. The last `self_images` ghosts are the engine's self images
// (HaloExchange::self_image_sources), each a copy of node owners[g]: an owned node or one
// of the ghosts before them; the others go through forward()/reverse().
class ImageHalo : public HaloExchange {
 public:
  ImageHalo(const Array<int32_t>& owners, int64_t self_images) {
    if (self_images < 0 || self_images > owners.size())
      throw Error("self_images: " + std::to_string(self_images) + " of " +
                  std::to_string(owners.size()) + " ghosts");
    const py::ssize_t exchanged = owners.size() - static_cast<py::ssize_t>(self_images);
    sources_.assign(owners.data() + exchanged, owners.data() + owners.size());
    std::vector<int32_t> slot;  // owner -> border row or -1
    for (py::ssize_t g = 0; g < exchanged; ++g) {
      const int32_t o = owners.data()[g];
      if (o < 0) throw Error("ghost_owners: negative owner " + std::to_string(o));
      if (static_cast<size_t>(o) >= slot.size()) slot.resize(o + 1, -1);
      if (slot[o] < 0) {
        slot[o] = static_cast<int32_t>(border_.size());
        border_.push_back(o);
      }
      ghost_slot_.push_back(slot[o]);
    }
  }
  int64_t num_border_nodes() const override { return static_cast<int64_t>(border_.size()); }
  const int32_t* border_nodes() const override { return border_.data(); }
  int64_t num_self_images() const override { return static_cast<int64_t>(sources_.size()); }
  const int32_t* self_image_sources() const override { return sources_.data(); }
  void forward(int width, const double* border_rows, double* ghost_rows) override {
    copy_rows(width, border_rows, ghost_rows);
  }
  void forward(int width, const float* border_rows, float* ghost_rows) override {
    copy_rows(width, border_rows, ghost_rows);
  }
  void reverse(int width, const double* ghost_rows, double* border_sums) override {
    sum_rows(width, ghost_rows, border_sums);
  }
  void reverse(int width, const float* ghost_rows, float* border_sums) override {
    sum_rows(width, ghost_rows, border_sums);
  }

 private:
  template <class T>
  void copy_rows(int width, const T* border_rows, T* ghost_rows) const {
    const size_t w = static_cast<size_t>(width);
    for (size_t g = 0; g < ghost_slot_.size(); ++g)
      std::memcpy(ghost_rows + g * w, border_rows + ghost_slot_[g] * w, w * sizeof(T));
  }
  template <class T>
  void sum_rows(int width, const T* ghost_rows, T* border_sums) const {
    const size_t w = static_cast<size_t>(width);
    std::fill(border_sums, border_sums + border_.size() * w, T(0));
    for (size_t g = 0; g < ghost_slot_.size(); ++g)
      for (size_t q = 0; q < w; ++q) border_sums[ghost_slot_[g] * w + q] += ghost_rows[g * w + q];
  }

  std::vector<int32_t> border_, ghost_slot_, sources_;
};

// An input with an optional halo exchange (null: none).
template <class View>
struct WithHalo {
  View view;
  HaloExchange* halo;
};

void engine_compute(Engine& engine, const GraphView& g, ComputeOutput& out) {
  engine.compute(g, out);
}
void engine_compute(Engine& engine, const WithHalo<GraphView>& g, ComputeOutput& out) {
  engine.compute(g.view, out, g.halo);
}
void engine_compute(Engine& engine, const SystemView& s, ComputeOutput& out) {
  engine.compute(s, out);
}
void engine_compute(Engine& engine, const WithHalo<NodesView>& nodes, ComputeOutput& out) {
  engine.compute(nodes.view, out, nodes.halo);
}

// The halo of ghost_owners (see ImageHalo) for nodes [num_owned, n), or none.
std::unique_ptr<ImageHalo> image_halo(const std::optional<Array<int32_t>>& ghost_owners, int64_t n,
                                      int64_t num_owned, int64_t self_images) {
  if (!ghost_owners) {
    if (self_images != 0) throw Error("self_images needs ghost_owners");
    return nullptr;
  }
  if (ghost_owners->ndim() != 1 || ghost_owners->shape(0) != n - num_owned)
    throw Error("ghost_owners needs one owner per ghost (num_nodes - num_owned)");
  return std::make_unique<ImageHalo>(*ghost_owners, self_images);
}

template <class Input>
py::dict compute_with(Engine& engine, const Input& input, int64_t n, bool forces, bool virial,
                      bool atom_virials) {
  Array<double> atom_energies(n), f({n, int64_t(3)}), v({int64_t(3), int64_t(3)}),
      av({n, int64_t(9)});
  ComputeOutput out;
  out.atom_energies = atom_energies.mutable_data();
  if (forces) out.forces = f.mutable_data();
  if (virial) out.virial = v.mutable_data();
  if (atom_virials) out.atom_virials = av.mutable_data();
  {
    py::gil_scoped_release release;
    engine_compute(engine, input, out);
  }
  py::dict result;
  result["energy"] = out.energy;
  result["energies"] = atom_energies;
  if (forces) result["forces"] = f;
  if (virial) result["virial"] = v;
  if (atom_virials) result["atom_virials"] = av;
  return result;
}

py::dict compute(Engine& engine, const GraphView& g, bool forces, bool virial, bool atom_virials) {
  return compute_with(engine, g, g.num_nodes, forces, virial, atom_virials);
}

// A radial table's grid and the errors its builder found (cpu::RadialTable), into `out`.
template <class T>
void put_table_grid(py::dict& out, const cpu::RadialTable<T>& t) {
  out["intervals"] = t.intervals;
  out["fine_intervals"] = t.fine_intervals;
  out["coarse_shift"] = t.coarse_shift;
  out["origin"] = t.origin;
  out["step"] = t.step;
  out["value_error"] = t.value_error;
  out["grad_error"] = t.grad_error;
}

// Op-level access to a model's plan in float64, for tests against e3nn/sevenn.
struct OpsProbe {
  std::shared_ptr<const Model> model;
  cpu::TypedPlan<double> plan;
  explicit OpsProbe(std::shared_ptr<const Model> m)
      : model(std::move(m)), plan(cpu::make_typed_plan<double>(model->plan())) {}

  // The plan of linear layer `name` ("layers.T.linear_1", "readout.0", ...), from which
  // cpu::make_linear<T> builds it in either precision (as make_typed_plan does).
  const LinearPlan& linear_plan(const std::string& name) const {
    const ModelPlan& mp = model->plan();
    if (name.rfind("readout.", 0) == 0) return mp.readout.at(std::stoi(name.substr(8)));
    const size_t dot = name.find('.', 7);
    const auto& layer = mp.layers.at(std::stoi(name.substr(7, dot - 7)));
    const std::string which = name.substr(dot + 1);
    if (which == "self_connection") {
      if (!layer.self_connection_species.empty())
        throw Error("'" + name + "' is one linear layer per species (self_connection_type nequip)");
      return layer.self_connection;
    }
    if (which == "linear_1") return layer.linear_1;
    if (which == "linear_2") return layer.linear_2;
    throw Error("unknown linear '" + name + "'");
  }
};

// The `device` keyword of the OpsProbe methods: true for "cuda" (the probes of
// cuda/probe.h), false for "cpu".
bool probe_on_cuda(const std::string& device) {
  if (device == "cpu") return false;
  if (device != "cuda") throw Error("unknown device '" + device + "' (cpu or cuda)");
#ifdef E3FUSE_WITH_CUDA
  return true;
#else
  throw Error("this e3fuse was built without CUDA");
#endif
}

// The `dtype` keyword of the linear probes: "float64" or "float32" (each its own kernels).
bool probe_float32(const std::string& dtype) {
  if (dtype == "float64") return false;
  if (dtype != "float32") throw Error("unknown dtype '" + dtype + "' (float64 or float32)");
  return true;
}

// out = W x + b, or with `transpose` out = W^T x, for n rows of x, in T on the CPU or GPU.
template <class T>
py::object run_linear_probe(const cpu::Linear<T>& lin, const Array<double>& x, bool transpose,
                            bool cuda) {
  const int64_t n = x.shape(0);
  const std::vector<T> in(x.data(), x.data() + x.size());
  Array<T> out({n, transpose ? lin.dim_in : lin.dim_out});
  if (cuda) {
#ifdef E3FUSE_WITH_CUDA
    cuda::probe_linear(lin, n, in.data(), out.mutable_data(), transpose);
#endif
  } else if (transpose) {
    cpu::linear_backward(lin, n, in.data(), out.mutable_data(), false);
  } else {
    cpu::linear_forward(lin, n, in.data(), out.mutable_data());
  }
  return std::move(out);
}

// OpsProbe.linear / linear_transpose: the model's linear layer `name` applied to the rows
// of x (dE/dy rows with `transpose`), in the given precision and place.
py::object linear_probe(const OpsProbe& p, const std::string& name, const Array<double>& x,
                        bool transpose, const std::string& device, const std::string& dtype) {
  const LinearPlan& lin = p.linear_plan(name);
  check_shape(x, {-1, transpose ? lin.out.dim : lin.in.dim}, transpose ? "grad" : "x");
  const bool cuda = probe_on_cuda(device);
  return probe_float32(dtype) ? run_linear_probe(cpu::make_linear<float>(lin), x, transpose, cuda)
                              : run_linear_probe(cpu::make_linear<double>(lin), x, transpose, cuda);
}

void check_species(const Array<int32_t>& species, int num_species) {
  for (int64_t i = 0; i < species.shape(0); ++i)
    if (species.data()[i] < 0 || species.data()[i] >= num_species)
      throw Error("species index out of range");
}

// e3nn's mul_ir layout <-> the convolution's ir_mul layout, row by row.
template <class Blocks>
Array<double> relayout(const Blocks& blocks, const Array<double>& in, bool to_ir_mul) {
  const int64_t n = in.shape(0), dim = in.shape(1);
  Array<double> out({n, dim});
  const double* src = in.data();
  double* dst = out.mutable_data();
  for (int64_t i = 0; i < n; ++i)
    for (const auto& b : blocks)
      for (int u = 0; u < b.mul; ++u)
        for (int m = 0; m < b.d; ++m) {
          const int64_t mul_ir = i * dim + b.offset + u * b.d + m,
                        ir_mul = i * dim + b.offset + m * b.mul + u;
          if (to_ir_mul)
            dst[ir_mul] = src[mul_ir];
          else
            dst[mul_ir] = src[ir_mul];
        }
  return out;
}

// A non-periodic CSR graph over the given arrays (all nodes count for energy).
GraphView open_graph(const Array<double>& positions, const Array<int64_t>& row_offsets,
                     const Array<int32_t>& neighbors, const std::vector<int32_t>& species) {
  const int64_t n = positions.shape(0);
  check_shape(row_offsets, {n + 1}, "row_offsets");
  if (n > 0 && row_offsets.at(n) != neighbors.shape(0)) {
    throw Error("row_offsets do not match neighbors");
  }
  GraphView g;
  g.num_nodes = g.num_energy_nodes = n;
  g.positions = positions.data();
  g.species = species.data();
  g.row_offsets = row_offsets.data();
  g.neighbors = neighbors.data();
  return g;
}

// The GPU neighbor list on host arrays (tests): update() on each of num_frames
// frames (num_frames x n x 3) with one list; returns (rebuilt flags, row_offsets,
// neighbors, images[E, 3]) after the last frame.
py::tuple gpu_neighbor_run(const double* frames, int64_t num_frames, int64_t n,
                           const Array<double>& cell, const std::vector<bool>& pbc, double cutoff,
                           double skin, double min_distance) {
#ifdef E3FUSE_WITH_CUDA
  check_shape(cell, {3, 3}, "cell");
  if (pbc.size() != 3) throw Error("pbc must have 3 entries");
  const bool p[3] = {pbc[0], pbc[1], pbc[2]};
  std::vector<int8_t> rebuilt;
  std::vector<int64_t> row_offsets;
  std::vector<int32_t> neighbors, images;
  {
    py::gil_scoped_release release;
    cuda::probe_neighbor_list_frames(cutoff, skin, n, num_frames, frames, cell.data(), p,
                                     min_distance, rebuilt, row_offsets, neighbors, images);
  }
  const int64_t E = static_cast<int64_t>(neighbors.size());
  Array<int64_t> ro(n + 1);
  Array<int32_t> nb(E), im({E, int64_t(3)});
  std::copy(row_offsets.begin(), row_offsets.end(), ro.mutable_data());
  std::copy(neighbors.begin(), neighbors.end(), nb.mutable_data());
  std::copy(images.begin(), images.end(), im.mutable_data());
  py::list flags;
  for (int8_t r : rebuilt) flags.append(r != 0);
  return py::make_tuple(flags, ro, nb, im);
#else
  (void)frames, (void)num_frames, (void)n, (void)cell, (void)pbc, (void)cutoff, (void)skin,
      (void)min_distance;
  throw Error("this e3fuse was built without CUDA");
#endif
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "e3fuse core (C++)";
  static py::exception<Error> error_type(m, "E3fuseError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::set_error(error_type, e.what());
    }
  });
  m.attr("__version__") = version();
  m.attr("FORMAT_VERSION") = kModelFormatVersion;
  m.def("cuda_available", &cuda_available);
  m.def("cuda_device_count", &cuda_device_count);
  // The GPU neighbor list (tests): (row_offsets, neighbors, images[E, 3]) of one build,
  // and (rebuilt flags, row_offsets, neighbors, images) of one list over frames [F, N, 3].
  m.def(
      "gpu_neighbor_edges",
      [](Array<double> positions, Array<double> cell, std::vector<bool> pbc, double cutoff,
         double skin, double min_distance) {
        check_shape(positions, {-1, 3}, "positions");
        py::tuple t = gpu_neighbor_run(positions.data(), 1, positions.shape(0), cell, pbc, cutoff,
                                       skin, min_distance);
        return py::make_tuple(t[1], t[2], t[3]);
      },
      py::arg("positions"), py::arg("cell"), py::arg("pbc"), py::arg("cutoff"),
      py::arg("skin") = 0.0, py::arg("min_distance") = 1e-4);
  m.def(
      "gpu_neighbor_frames",
      [](Array<double> frames, Array<double> cell, std::vector<bool> pbc, double cutoff,
         double skin, double min_distance) {
        check_shape(frames, {-1, -1, 3}, "frames");
        return gpu_neighbor_run(frames.data(), frames.shape(0), frames.shape(1), cell, pbc, cutoff,
                                skin, min_distance);
      },
      py::arg("frames"), py::arg("cell"), py::arg("pbc"), py::arg("cutoff"), py::arg("skin") = 0.0,
      py::arg("min_distance") = 1e-4);
  m.def("set_log_callback", [](py::object callback) {
    if (callback.is_none()) {
      set_log_callback(nullptr);
      return;
    }
    set_log_callback([callback](LogLevel level, const std::string& msg) {
      py::gil_scoped_acquire gil;
      callback(static_cast<int>(level), msg);
    });
  });

  py::class_<Model, std::shared_ptr<Model>>(m, "Model")
      .def_static(
          "load",
          [](const std::string& path) { return std::const_pointer_cast<Model>(Model::load(path)); })
      .def_property_readonly("family", &Model::family)
      .def_property_readonly("cutoff", &Model::cutoff)
      .def_property_readonly("num_layers", &Model::num_layers)
      .def_property_readonly("format_version", &Model::format_version)
      .def_property_readonly("atomic_numbers", &Model::atomic_numbers)
      .def_property_readonly("num_parameters", &Model::num_parameters)
      .def_property_readonly("architecture_json", &Model::architecture_json)
      .def("species_of", &Model::species_of)
      .def("summary", &Model::summary)
      // [(name, atoms.info key / pair_style keyword, default)], see Model::system_inputs
      .def_property_readonly("system_inputs",
                             [](const Model& model) {
                               py::list out;
                               for (const Model::SystemInput& in : model.system_inputs())
                                 out.append(py::make_tuple(in.name, in.key, in.default_value));
                               return out;
                             })
      .def_property_readonly("needs_system_inputs", &Model::needs_system_inputs)
      .def("with_system_inputs", [](const Model& model, const std::vector<double>& values) {
        return std::const_pointer_cast<Model>(model.with_system_inputs(values));
      });

  py::class_<NeighborList>(m, "NeighborList")
      .def(py::init<double, double>(), py::arg("cutoff"), py::arg("skin") = 0.0)
      .def("set_min_distance", &NeighborList::set_min_distance)
      .def("invalidate", &NeighborList::invalidate)
      .def_property("num_owned", &NeighborList::num_owned, &NeighborList::set_num_owned,
                    "pairs of two atoms past the first num_owned are left out; -1: none")
      .def_property_readonly("num_builds", &NeighborList::num_builds)
      .def_property_readonly("num_edges", &NeighborList::num_edges)
      .def_property_readonly("cutoff", &NeighborList::cutoff)
      .def_property_readonly("skin", &NeighborList::skin)
      .def(
          "update",
          [](NeighborList& nl, Array<double> positions, Array<double> cell, std::vector<bool> pbc) {
            check_shape(positions, {-1, 3}, "positions");
            check_shape(cell, {3, 3}, "cell");
            if (pbc.size() != 3) throw Error("pbc must have 3 entries");
            bool p[3] = {pbc[0], pbc[1], pbc[2]};
            py::gil_scoped_release release;
            return nl.update(positions.shape(0), positions.data(), cell.data(), p);
          })
      .def("edges", [](const NeighborList& nl, Array<double> positions) {
        const int64_t n =
            static_cast<int64_t>(nl.row_offsets().empty() ? 0 : nl.row_offsets().size() - 1);
        check_shape(positions, {n, 3}, "positions");
        const int64_t E = nl.num_edges();
        Array<int64_t> recv(E), send(E), shifts({E, int64_t(3)});
        Array<double> vec({E, int64_t(3)}), dist(E);
        auto r = recv.mutable_unchecked<1>();
        auto s = send.mutable_unchecked<1>();
        auto sh = shifts.mutable_unchecked<2>();
        auto v = vec.mutable_unchecked<2>();
        auto d = dist.mutable_unchecked<1>();
        const double* p = positions.data();
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t e = nl.row_offsets()[i]; e < nl.row_offsets()[i + 1]; ++e) {
            const int64_t j = nl.neighbors()[e];
            const int32_t k = nl.shift_index()[e];
            r(e) = i;
            s(e) = j;
            double len2 = 0;
            for (int a = 0; a < 3; ++a) {
              sh(e, a) = nl.shift_cells()[3 * k + a];
              v(e, a) = p[3 * j + a] - p[3 * i + a] + nl.shifts()[3 * k + a];
              len2 += v(e, a) * v(e, a);
            }
            d(e) = std::sqrt(len2);
          }
        }
        py::dict out;
        out["receivers"] = recv;
        out["senders"] = send;
        out["shifts"] = shifts;
        out["vectors"] = vec;
        out["distances"] = dist;
        return out;
      });

  py::class_<Engine>(m, "Engine")
      .def(py::init([](std::shared_ptr<Model> model, const std::string& device,
                       const std::string& precision, int num_threads, const std::string& radial) {
             return std::make_unique<Engine>(model, parse_device(device),
                                             parse_precision(precision), num_threads,
                                             parse_gpu_index(device), parse_radial(radial));
           }),
           py::arg("model"), py::arg("device") = "cpu", py::arg("precision") = "float64",
           py::arg("num_threads") = 0, py::arg("radial") = "auto")
      .def("describe", &Engine::describe)
      .def_property_readonly("device", [](const Engine& e) { return to_string(e.device()); })
      .def_property_readonly("precision", [](const Engine& e) { return to_string(e.precision()); })
      .def_property_readonly("radial", [](const Engine& e) { return to_string(e.radial()); })
      // Evaluate on the neighbor list's current graph (after NeighborList.update).
      .def(
          "compute_neighbors",
          [](Engine& engine, const NeighborList& nl, Array<double> positions,
             Array<int32_t> species, bool forces, bool virial, bool atom_virials) {
            const int64_t n = species.shape(0);
            check_shape(positions, {n, 3}, "positions");
            if (static_cast<int64_t>(nl.row_offsets().size()) != n + 1) {
              throw Error("neighbor list was built for a different number of atoms");
            }
            GraphView g = nl.view(positions.data(), species.data());
            return compute(engine, g, forces, virial, atom_virials);
          },
          py::arg("neighbors"), py::arg("positions"), py::arg("species"), py::arg("forces") = true,
          py::arg("virial") = true, py::arg("atom_virials") = false)
      // Evaluate a whole system with the engine's own neighbor list (GPU list on cuda).
      .def(
          "compute_system",
          [](Engine& engine, Array<double> positions, Array<int32_t> species, Array<double> cell,
             std::array<bool, 3> pbc, bool forces, bool virial, bool atom_virials) {
            const int64_t n = species.shape(0);
            check_shape(positions, {n, 3}, "positions");
            check_shape(cell, {3, 3}, "cell");
            SystemView s;
            s.num_atoms = n;
            s.positions = positions.data();
            s.species = species.data();
            s.cell = cell.data();
            for (int a = 0; a < 3; ++a) s.pbc[a] = pbc[a];
            return compute_with(engine, s, n, forces, virial, atom_virials);
          },
          py::arg("positions"), py::arg("species"), py::arg("cell"), py::arg("pbc"),
          py::arg("forces") = true, py::arg("virial") = true, py::arg("atom_virials") = false)
      // per-system inputs (MACE embedding_specs): other values without a new engine
      .def("set_system_inputs", &Engine::set_system_inputs, py::arg("values"))
      .def_property_readonly("system_input_values", &Engine::system_input_values)
      .def("set_neighbor_skin", &Engine::set_neighbor_skin)
      .def("set_min_distance", &Engine::set_min_distance)
      .def_property_readonly("num_neighbor_builds", &Engine::num_neighbor_builds)
      .def_property_readonly("num_neighbor_edges", &Engine::num_neighbor_edges)
      .def_property_readonly("num_step_replays", &Engine::num_step_replays)
      .def_property_readonly("neighbor_skin", &Engine::neighbor_skin)
      .def_property("region_atoms", &Engine::region_atoms, &Engine::set_region_atoms,
                    "most atoms (owned + ghosts) per region of compute_system; 0: automatic")
      .def_property_readonly("num_regions", &Engine::num_regions)
      .def_static("device_bytes_in_use", &Engine::device_bytes_in_use)
      .def_static("device_bytes_peak", &Engine::device_bytes_peak)
      .def_static("reset_device_bytes_peak", &Engine::reset_device_bytes_peak)
      // Evaluate on an explicit CSR graph (no shifts): LAMMPS-like local + ghost input.
      // same_edges_as_last: GraphView's promise that row_offsets and neighbors are those of
      // this engine's previous compute_graph (only positions changed).
      .def(
          "compute_graph",
          [](Engine& engine, Array<double> positions, Array<int32_t> species,
             Array<int64_t> row_offsets, Array<int32_t> neighbors, int64_t num_energy_nodes,
             bool forces, bool virial, bool atom_virials, bool same_edges_as_last,
             std::optional<Array<int32_t>> ghost_owners, int64_t self_images) {
            const int64_t n = species.shape(0);
            check_shape(positions, {n, 3}, "positions");
            check_shape(row_offsets, {n + 1}, "row_offsets");
            if (n > 0 && row_offsets.at(n) != neighbors.shape(0))
              throw Error("row_offsets do not match neighbors");
            GraphView g;
            g.num_nodes = n;
            g.num_energy_nodes = num_energy_nodes < 0 ? n : num_energy_nodes;
            g.positions = positions.data();
            g.species = species.data();
            g.row_offsets = row_offsets.data();
            g.neighbors = neighbors.data();
            g.same_edges_as_last = same_edges_as_last;
            const auto halo = image_halo(ghost_owners, n, g.num_energy_nodes, self_images);
            return compute_with(engine, WithHalo<GraphView>{g, halo.get()}, n, forces, virial,
                                atom_virials);
          },
          py::arg("positions"), py::arg("species"), py::arg("row_offsets"), py::arg("neighbors"),
          py::arg("num_energy_nodes") = -1, py::arg("forces") = true, py::arg("virial") = true,
          py::arg("atom_virials") = false, py::arg("same_edges_as_last") = false,
          py::arg("ghost_owners") = py::none(), py::arg("self_images") = 0)
      // Evaluate nodes whose edges the engine finds (NodesView): nodes [0, num_owned) owned
      // (-1: all), the others ghosts without ghost-ghost edges.
      // ghost_owners (compute_graph and compute_nodes): the owned node each ghost copies, a
      // halo exchange within this process (ImageHalo); none: no halo exchange.
      // self_images: how many of the last ghosts the engine copies itself from node
      // ghost_owners[g] (owned, or a ghost before them), see ImageHalo.
      .def(
          "compute_nodes",
          [](Engine& engine, Array<double> positions, Array<int32_t> species, int64_t num_owned,
             bool forces, bool virial, bool atom_virials, bool same_nodes_as_last,
             std::optional<Array<int32_t>> ghost_owners, int64_t self_images) {
            const int64_t n = species.shape(0);
            check_shape(positions, {n, 3}, "positions");
            NodesView nodes;
            nodes.num_nodes = n;
            nodes.num_owned = num_owned < 0 ? n : num_owned;
            nodes.positions = positions.data();
            nodes.species = species.data();
            nodes.same_nodes_as_last = same_nodes_as_last;
            const auto halo = image_halo(ghost_owners, n, nodes.num_owned, self_images);
            return compute_with(engine, WithHalo<NodesView>{nodes, halo.get()}, n, forces, virial,
                                atom_virials);
          },
          py::arg("positions"), py::arg("species"), py::arg("num_owned") = -1,
          py::arg("forces") = true, py::arg("virial") = true, py::arg("atom_virials") = false,
          py::arg("same_nodes_as_last") = false, py::arg("ghost_owners") = py::none(),
          py::arg("self_images") = 0)
      // (row_offsets, neighbors) of the edges the last compute_nodes found.
      .def("node_graph", [](const Engine& engine) {
        std::vector<int64_t> row_offsets;
        std::vector<int32_t> neighbors;
        engine.node_graph(row_offsets, neighbors);
        Array<int64_t> ro(static_cast<int64_t>(row_offsets.size()));
        Array<int32_t> nb(static_cast<int64_t>(neighbors.size()));
        std::copy(row_offsets.begin(), row_offsets.end(), ro.mutable_data());
        std::copy(neighbors.begin(), neighbors.end(), nb.mutable_data());
        return py::make_tuple(ro, nb);
      });

  // Op-level probes (float64) used by the tests that compare each op with e3nn.
  py::class_<OpsProbe>(m, "OpsProbe")
      .def(py::init([](std::shared_ptr<Model> model) { return std::make_unique<OpsProbe>(model); }))
      .def("spherical_harmonics",
           [](const OpsProbe& p, Array<double> vectors) {
             check_shape(vectors, {-1, 3}, "vectors");
             const int64_t n = vectors.shape(0);
             const int dim = p.plan.sh.dim;
             Array<double> Y({n, int64_t(dim)}), J({n, int64_t(dim), int64_t(3)});
             std::vector<double> dP(3 * dim), g(dim);
             for (int64_t e = 0; e < n; ++e) {
               const double* v = vectors.data() + 3 * e;
               const double r = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
               const double u[3] = {v[0] / r, v[1] / r, v[2] / r};
               ops::spherical_harmonics(p.plan.sh, p.plan.sh.normalize ? u : v,
                                        Y.mutable_data() + e * dim, dP.data());
               for (int m = 0; m < dim;
                    ++m) {  // full Jacobian via one-hot vector-Jacobian products
                 std::fill(g.begin(), g.end(), 0.0);
                 g[m] = 1.0;
                 ops::spherical_harmonics_vjp(dim, g.data(), dP.data(), u, r,
                                              J.mutable_data() + (e * dim + m) * 3,
                                              p.plan.sh.normalize);
               }
             }
             return py::make_tuple(Y, J);
           })
      .def("edge_embedding",
           [](const OpsProbe& p, Array<double> r) {
             const int64_t n = r.shape(0);
             const int nb = p.plan.num_basis;
             Array<double> emb({n, int64_t(nb)}), demb({n, int64_t(nb)});
             for (int64_t e = 0; e < n; ++e)
               ops::edge_embedding(nb, p.plan.radial_coeffs.data(), p.plan.radial_prefactor,
                                   p.plan.envelope, r.at(e), emb.mutable_data() + e * nb,
                                   demb.mutable_data() + e * nb);
             return py::make_tuple(emb, demb);
           })
      .def(
          "linear",
          [](const OpsProbe& p, const std::string& name, Array<double> x, const std::string& device,
             const std::string& dtype) { return linear_probe(p, name, x, false, device, dtype); },
          py::arg("name"), py::arg("x"), py::kw_only(), py::arg("device") = "cpu",
          py::arg("dtype") = "float64")
      .def(
          "linear_transpose",
          [](const OpsProbe& p, const std::string& name, Array<double> g, const std::string& device,
             const std::string& dtype) { return linear_probe(p, name, g, true, device, dtype); },
          py::arg("name"), py::arg("grad"), py::kw_only(), py::arg("device") = "cpu",
          py::arg("dtype") = "float64")
      .def(
          "element_linear",
          [](const OpsProbe& p, int layer, Array<double> x, Array<int32_t> species, bool transpose,
             const std::string& device, const std::string& dtype) -> py::object {
            const auto& plan = p.model->plan().mace_layers.at(layer).skip;
            const int64_t n = x.shape(0);
            check_species(species, p.plan.num_species);
            const bool cuda = probe_on_cuda(device);
            auto run = [&](auto typed) -> py::object {
              using T = decltype(typed);
              const auto lin = cpu::make_element_linear<T>(plan);
              const int64_t dim_src = transpose ? lin.dim_out : lin.dim_in;
              const int64_t dim_dst = transpose ? lin.dim_in : lin.dim_out;
              check_shape(x, {-1, dim_src}, "x");
              check_shape(species, {n}, "species");
              const std::vector<T> in(x.data(), x.data() + x.size());
              Array<T> out({n, dim_dst});
              if (cuda) {
#ifdef E3FUSE_WITH_CUDA
                cuda::probe_element_linear(lin, n, species.data(), in.data(), out.mutable_data(),
                                           transpose);
#endif
              } else if (transpose) {
                cpu::element_linear_backward(lin, n, species.data(), in.data(), out.mutable_data(),
                                             false);
              } else {
                cpu::element_linear_forward(lin, n, species.data(), in.data(), out.mutable_data());
              }
              return std::move(out);
            };
            return probe_float32(dtype) ? run(0.0f) : run(0.0);
          },
          py::arg("layer"), py::arg("x"), py::arg("species"), py::kw_only(),
          py::arg("transpose") = false, py::arg("device") = "cpu", py::arg("dtype") = "float64")
      .def(
          "edge_density",
          [](const OpsProbe& p, int layer, Array<double> r, int species_a, int species_b,
             bool table, const std::string& dtype) -> py::dict {
            const ModelPlan& mp = p.model->plan();
            const MaceLayer& l = mp.mace_layers.at(layer);
            if (!l.density) throw Error("MACE layer " + std::to_string(layer) + " has no density");
            for (const int s : {species_a, species_b})
              if (s < 0 || s >= p.plan.num_species)
                throw Error("species index " + std::to_string(s) + " out of range [0, " +
                            std::to_string(p.plan.num_species) + ")");
            const int64_t n = r.shape(0);
            auto run = [&](auto typed) -> py::dict {
              using T = decltype(typed);
              const cpu::TypedPlan<T> plan = cpu::make_typed_plan<T>(mp);
              cpu::EdgeDensity<T> d =
                  cpu::make_edge_density<T>(l.density_weights, table ? &mp : nullptr);
              const int32_t pair_species[2] = {species_a, species_b};
              cpu::ensure_density_tables(d, 2, pair_species);
              const int pair = species_a * plan.num_species + species_b;
              Array<double> value({n}), grad({n});
              for (int64_t e = 0; e < n; ++e)
                cpu::edge_density_at(plan, d, pair, r.at(e), value.mutable_at(e),
                                     grad.mutable_at(e));
              py::dict out;
              out["value"] = value;
              out["grad"] = grad;
              if (d.tabulated()) put_table_grid(out, d.table_for_pair(pair));
              return out;
            };
            return probe_float32(dtype) ? run(0.0f) : run(0.0);
          },
          py::arg("layer"), py::arg("r"), py::arg("species_a") = 0, py::arg("species_b") = 0,
          py::kw_only(), py::arg("table") = false, py::arg("dtype") = "float64")
      .def(
          "symmetric_contraction",
          [](const OpsProbe& p, int layer, Array<double> x, Array<int32_t> species,
             const std::string& device) {
            const auto sc = cpu::make_symmetric_contraction<double>(
                p.model->plan().mace_layers.at(layer).product);
            check_shape(x, {-1, sc.dim_in}, "x");
            const int64_t n = x.shape(0);
            check_shape(species, {n}, "species");
            check_species(species, p.plan.num_species);
            Array<double> out({n, sc.dim_out});
            if (probe_on_cuda(device)) {
#ifdef E3FUSE_WITH_CUDA
              cuda::probe_symmetric_contraction(sc, n, species.data(), x.data(), nullptr,
                                                out.mutable_data());
#endif
            } else {
              cpu::symmetric_contraction_forward(sc, n, species.data(), x.data(),
                                                 out.mutable_data());
            }
            return out;
          },
          py::arg("layer"), py::arg("x"), py::arg("species"), py::kw_only(),
          py::arg("device") = "cpu")
      .def(
          "symmetric_contraction_transpose",
          [](const OpsProbe& p, int layer, Array<double> x, Array<int32_t> species, Array<double> g,
             const std::string& device) {
            const auto sc = cpu::make_symmetric_contraction<double>(
                p.model->plan().mace_layers.at(layer).product);
            const int64_t n = x.shape(0);
            check_shape(x, {n, sc.dim_in}, "x");
            check_shape(species, {n}, "species");
            check_shape(g, {n, sc.dim_out}, "grad");
            check_species(species, p.plan.num_species);
            Array<double> out({n, sc.dim_in});
            if (probe_on_cuda(device)) {
#ifdef E3FUSE_WITH_CUDA
              cuda::probe_symmetric_contraction(sc, n, species.data(), x.data(), g.data(),
                                                out.mutable_data());
#endif
            } else {
              cpu::symmetric_contraction_backward(sc, n, species.data(), x.data(), g.data(),
                                                  out.mutable_data());
            }
            return out;
          },
          py::arg("layer"), py::arg("x"), py::arg("species"), py::arg("grad"), py::kw_only(),
          py::arg("device") = "cpu")
      .def(
          "gate",
          [](const OpsProbe& p, int layer, Array<double> x, const std::string& device) {
            const auto& gate = p.plan.layers.at(layer).gate;
            check_shape(x, {-1, gate.plan.dim_in}, "x");
            const int64_t n = x.shape(0);
            Array<double> out({n, gate.plan.dim_out});
            if (probe_on_cuda(device)) {
#ifdef E3FUSE_WITH_CUDA
              cuda::probe_gate(gate, n, x.data(), nullptr, out.mutable_data());
#endif
            } else {
              cpu::gate_forward(gate, n, x.data(), out.mutable_data());
            }
            return out;
          },
          py::arg("layer"), py::arg("x"), py::kw_only(), py::arg("device") = "cpu")
      .def(
          "gate_transpose",
          [](const OpsProbe& p, int layer, Array<double> x, Array<double> g,
             const std::string& device) {
            const auto& gate = p.plan.layers.at(layer).gate;
            const int64_t n = x.shape(0);
            check_shape(x, {n, gate.plan.dim_in}, "x");
            check_shape(g, {n, gate.plan.dim_out}, "grad");
            Array<double> out({n, gate.plan.dim_in});
            if (probe_on_cuda(device)) {
#ifdef E3FUSE_WITH_CUDA
              cuda::probe_gate(gate, n, x.data(), g.data(), out.mutable_data());
#endif
            } else {
              cpu::gate_backward(gate, n, x.data(), g.data(), out.mutable_data());
            }
            return out;
          },
          py::arg("layer"), py::arg("x"), py::arg("grad"), py::kw_only(), py::arg("device") = "cpu")
      .def("embedding",
           [](const OpsProbe& p, Array<int32_t> species) {
             const int64_t n = species.shape(0);
             Array<double> out({n, int64_t(p.plan.embedding_dim)});
             for (int64_t i = 0; i < n; ++i) {
               const int s = species.at(i);
               if (s < 0 || s >= p.plan.num_species) throw Error("species out of range");
               std::copy_n(p.plan.embedding.data() + s * p.plan.embedding_dim, p.plan.embedding_dim,
                           out.mutable_data() + i * p.plan.embedding_dim);
             }
             return out;
           })
      // MACE's ZBL pair repulsion on an open CSR graph (nodes < num_energy_nodes count):
      // (energies [n], forces [n, 3], per-atom virials [n, 9]) of weight * the pair energy.
      .def(
          "pair_repulsion",
          [](const OpsProbe& p, Array<double> positions, Array<int32_t> species,
             Array<int64_t> row_offsets, Array<int32_t> neighbors, int64_t num_energy_nodes,
             double weight, const std::string& device) {
            const ModelPlan& plan = p.model->plan();
            if (!plan.pair_repulsion.enabled) throw Error("the model has no pair repulsion");
            const int64_t n = positions.shape(0);
            check_shape(species, {n}, "species");
            std::vector<int32_t> s(species.data(), species.data() + n);
            for (int32_t v : s)
              if (v < 0 || v >= static_cast<int32_t>(plan.atomic_numbers.size()))
                throw Error("species index out of range");
            GraphView g = open_graph(positions, row_offsets, neighbors, s);
            g.num_energy_nodes = std::clamp<int64_t>(num_energy_nodes, 0, n);
            Array<double> energies(n), forces({n, int64_t(3)}), virials({n, int64_t(9)});
            std::fill_n(energies.mutable_data(), n, 0.0);
            std::fill_n(forces.mutable_data(), 3 * n, 0.0);
            std::fill_n(virials.mutable_data(), 9 * n, 0.0);
            if (probe_on_cuda(device)) {
#ifdef E3FUSE_WITH_CUDA
              cuda::probe_pair_repulsion(plan, g, weight, energies.mutable_data(),
                                         forces.mutable_data(), virials.mutable_data());
#endif
            } else {
              const std::vector<double> table =
                  ops::pair_repulsion_table(plan.pair_repulsion, plan.atomic_numbers);
              const ops::PairRepulsionView zbl = ops::pair_repulsion_view(
                  plan.pair_repulsion, static_cast<int>(plan.atomic_numbers.size()), plan.cutoff,
                  table.data());
              cpu::pair_repulsion_forward(zbl, g, g.num_energy_nodes, energies.mutable_data());
              cpu::pair_repulsion_backward(zbl, g, n, weight, forces.mutable_data(),
                                           virials.mutable_data());
            }
            return py::make_tuple(energies, forces, virials);
          },
          py::arg("positions"), py::arg("species"), py::arg("row_offsets"), py::arg("neighbors"),
          py::arg("num_energy_nodes"), py::arg("weight") = 1.0, py::arg("device") = "cpu")
      // The radial MLP of (SevenNet) layer `layer` as the float32 or float64 engine tabulates
      // it (cpu::make_radial_table), read at each r as the convolutions read it; with a coarse
      // tail when the one-step table would exceed coarse_tail_above bytes in float32 (default:
      // the engine's threshold; 0: always; -1: never).
      .def(
          "radial_table",
          [](const OpsProbe& p, int layer, Array<double> r, const std::string& dtype,
             int64_t coarse_tail_above) {
            const ModelPlan& mp = p.model->plan();
            const MlpPlan& mlp = mp.layers.at(layer).conv.mlp;
            const size_t tail_above = coarse_tail_above < 0
                                          ? std::numeric_limits<size_t>::max()
                                          : static_cast<size_t>(coarse_tail_above);
            const int64_t n = r.shape(0);
            auto run = [&](auto typed) -> py::dict {
              using T = decltype(typed);
              const cpu::RadialTable<T> t =
                  cpu::make_radial_table<T>(mp, mlp, 0.0, 0, nullptr, 0, tail_above);
              const int64_t W = mlp.dims.back();
              Array<double> value({n, W}), grad({n, W});
              for (int64_t e = 0; e < n; ++e) {
                int interval = 0;
                double x = 0.0;
                ops::radial_table_locate(r.at(e), t.origin, t.inv_step, t.intervals,
                                         t.fine_intervals, t.coarse_shift, interval, x);
                const T* c = t.coeffs.data() + static_cast<size_t>(interval) * W * 4;
                for (int64_t w = 0; w < W; ++w) {
                  value.mutable_at(e, w) = ops::radial_table_value(c + 4 * w, static_cast<T>(x));
                  grad.mutable_at(e, w) = ops::radial_table_grad(c + 4 * w, static_cast<T>(x),
                                                                 static_cast<T>(t.inv_step));
                }
              }
              py::dict out;
              out["value"] = value;
              out["grad"] = grad;
              put_table_grid(out, t);
              return out;
            };
            return probe_float32(dtype) ? run(0.0f) : run(0.0);
          },
          py::arg("layer"), py::arg("r"), py::kw_only(), py::arg("dtype") = "float64",
          py::arg("coarse_tail_above") = static_cast<int64_t>(cpu::kRadialTableCoarseTailAbove))
      // Convolution of layer `layer` on an open (non-periodic) CSR graph.
      .def("conv",
           [](const OpsProbe& p, int layer, Array<double> positions, Array<int64_t> row_offsets,
              Array<int32_t> neighbors, Array<double> x) {
             const auto& conv = p.plan.layers.at(layer).conv;
             const int64_t n = positions.shape(0);
             check_shape(x, {n, conv.dim_in}, "x");
             std::vector<int32_t> species(n, 0);
             GraphView g = open_graph(positions, row_offsets, neighbors, species);
             Array<double> y({n, conv.dim_out});
             Array<double> xt = relayout(conv.in_blocks, x, true);
             cpu::conv_forward(p.plan, conv, g, xt.data(), y.mutable_data());
             return relayout(conv.out_blocks, y, false);
           })
      .def("conv_backward",
           [](const OpsProbe& p, int layer, Array<double> positions, Array<int64_t> row_offsets,
              Array<int32_t> neighbors, Array<double> x, Array<double> grad_y) {
             const auto& conv = p.plan.layers.at(layer).conv;
             const int64_t n = positions.shape(0);
             check_shape(x, {n, conv.dim_in}, "x");
             check_shape(grad_y, {n, conv.dim_out}, "grad_y");
             std::vector<int32_t> species(n, 0);
             GraphView g = open_graph(positions, row_offsets, neighbors, species);
             Array<double> gx({n, conv.dim_in}), forces({n, int64_t(3)});
             std::fill_n(forces.mutable_data(), 3 * n, 0.0);
             Array<double> xt = relayout(conv.in_blocks, x, true);
             Array<double> gyt = relayout(conv.out_blocks, grad_y, true);
             cpu::conv_backward(p.plan, conv, g, xt.data(), gyt.data(), gx.mutable_data(),
                                forces.mutable_data(), nullptr);
             return py::make_tuple(relayout(conv.in_blocks, gx, false), forces);
           });
}
