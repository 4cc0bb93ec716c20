// model/model.cpp: reads an .e3f file (safetensors + architecture JSON in the
// metadata key "e3fuse") into a ModelPlan, validating every size on the way.
#include "e3fuse/model.h"

#include <cmath>
#include <cstdio>

#include "e3fuse/engine.h"
#include "e3fuse/error.h"
#include "model/json.h"
#include "model/plan.h"
#include "model/safetensors.h"

namespace e3fuse {

namespace {

class PlanBuilder {
 public:
  PlanBuilder(const SafetensorsFile& file, const std::string& origin)
      : file_(file), origin_(origin) {}

  std::vector<double> tensor(const json::Value& name_value, std::vector<int64_t> expected_shape) {
    const std::string name = name_value.as_string();
    if (!file_.has(name))
      fail("tensor '" + name + "' named at " + name_value.path() + " is missing");
    std::vector<int64_t> shape = file_.shape(name);
    if (shape != expected_shape) {
      fail("tensor '" + name + "' has shape " + shape_string(shape) + ", expected " +
           shape_string(expected_shape));
    }
    std::vector<double> values = file_.to_double(name);
    for (double v : values) {
      if (!std::isfinite(v)) fail("tensor '" + name + "' contains NaN or inf");
    }
    num_parameters_ += static_cast<int64_t>(values.size());
    return values;
  }

  Irreps irreps(const json::Value& v) {
    Irreps out;
    for (size_t i = 0; i < v.size(); ++i) {
      IrrepBlock b;
      b.mul = static_cast<int>(v[i][0].as_int());
      b.l = static_cast<int>(v[i][1].as_int());
      b.parity = static_cast<int>(v[i][2].as_int());
      if (b.mul < 0 || b.l < 0 || b.l > 8) fail("bad irrep at " + v[i].path());
      b.offset = out.dim;
      out.dim += b.dim();
      out.blocks.push_back(b);
    }
    return out;
  }

  LinearPlan linear(const json::Value& v) {
    LinearPlan plan;
    plan.in = irreps(v["irreps_in"]);
    plan.out = irreps(v["irreps_out"]);
    for (const json::Value& p : v["paths"].array()) {
      LinearPath path;
      path.in_block = block_index(p["in"], plan.in);
      path.out_block = block_index(p["out"], plan.out);
      const IrrepBlock& bi = plan.in.blocks[path.in_block];
      const IrrepBlock& bo = plan.out.blocks[path.out_block];
      if (bi.l != bo.l) fail("linear path at " + p.path() + " connects different l");
      path.weight = tensor(p["weight"], {bi.mul, bo.mul});
      plan.paths.push_back(std::move(path));
    }
    for (const json::Value& b : v["biases"].array()) {
      LinearBias bias;
      bias.out_block = block_index(b["out"], plan.out);
      const IrrepBlock& bo = plan.out.blocks[bias.out_block];
      if (bo.l != 0) fail("bias on a non-scalar output at " + b.path());
      bias.bias = tensor(b["weight"], {bo.mul});
      plan.biases.push_back(std::move(bias));
    }
    return plan;
  }

  MlpPlan mlp(const json::Value& v) {
    MlpPlan plan;
    for (int64_t d : v["dims"].as_int_vector()) plan.dims.push_back(static_cast<int>(d));
    if (plan.dims.size() < 2 || v["weights"].size() != plan.dims.size() - 1) {
      fail("radial MLP at " + v.path() + " has inconsistent dims/weights");
    }
    for (size_t i = 0; i + 1 < plan.dims.size(); ++i) {
      plan.weights.push_back(tensor(v["weights"][i], {plan.dims[i], plan.dims[i + 1]}));
    }
    plan.act = parse_activation(v["act"].as_string());
    plan.act_scale = v["scale"].as_double();
    return plan;
  }

  // mace's RadialMLP (RadialMlpPlan); num_species for the per-pair first-layer bias.
  RadialMlpPlan radial_mlp(const json::Value& v, int num_species) {
    RadialMlpPlan plan;
    for (int64_t d : v["dims"].as_int_vector()) plan.dims.push_back(static_cast<int>(d));
    const size_t layers = plan.dims.size() - 1;
    if (plan.dims.size() < 2 || v["weights"].size() != layers || v["biases"].size() != layers - 1 ||
        v["gamma"].size() != layers - 1 || v["beta"].size() != layers - 1)
      fail("radial MLP at " + v.path() + " has inconsistent layer lists");
    for (size_t i = 0; i < layers; ++i) {
      plan.weights.push_back(tensor(v["weights"][i], {plan.dims[i], plan.dims[i + 1]}));
      plan.biases.push_back(i == 0 ? std::vector<double>{}
                                   : tensor(v["biases"][i - 1], {plan.dims[i + 1]}));
      if (i + 1 < layers) {
        plan.gamma.push_back(tensor(v["gamma"][i], {plan.dims[i + 1]}));
        plan.beta.push_back(tensor(v["beta"][i], {plan.dims[i + 1]}));
      }
    }
    plan.pair_bias = tensor(v["pair_bias"], {num_species * num_species, plan.dims[1]});
    plan.eps = v["eps"].as_double();
    if (!(plan.eps > 0)) fail("radial MLP at " + v.path() + ": LayerNorm eps must be positive");
    return plan;
  }

  ConvPlan conv(const json::Value& v, const ShPlan& sh, int num_species = 0) {
    ConvPlan plan;
    plan.in = irreps(v["irreps_in"]);
    plan.sh = irreps(v["irreps_sh"]);
    plan.out = irreps(v["irreps_out"]);
    plan.weight_numel = v["weight_numel"].as_int();
    if (plan.sh.dim != sh.dim)
      fail("convolution at " + v.path() + ": spherical harmonics mismatch");
    std::vector<int> out_used(plan.out.blocks.size(), 0);
    for (const json::Value& p : v["instructions"].array()) {
      TensorProductPath path;
      path.in_block = block_index(p["in"], plan.in);
      path.sh_block = block_index(p["sh"], plan.sh);
      path.out_block = block_index(p["out"], plan.out);
      const IrrepBlock& b1 = plan.in.blocks[path.in_block];
      const IrrepBlock& b2 = plan.sh.blocks[path.sh_block];
      const IrrepBlock& b3 = plan.out.blocks[path.out_block];
      path.l1 = b1.l;
      path.l2 = b2.l;
      path.l3 = b3.l;
      if (b2.mul != 1 || b3.mul != b1.mul) fail("instruction at " + p.path() + " is not 'uvu'");
      path.weight_offset = p["weight_offset"].as_int();
      if (path.weight_offset < 0 || path.weight_offset + b1.mul > plan.weight_numel) {
        fail("instruction at " + p.path() + " has weights out of range");
      }
      path.cg = tensor(p["cg"], {2 * b1.l + 1, 2 * b2.l + 1, 2 * b3.l + 1});
      num_parameters_ -= static_cast<int64_t>(path.cg.size());  // constants, not parameters
      out_used[path.out_block] += 1;
      plan.paths.push_back(std::move(path));
    }
    if (v.contains("radial_mlp")) {
      plan.radial_mlp = radial_mlp(v["radial_mlp"], num_species);
      if (plan.radial_mlp.dims.back() != plan.weight_numel)
        fail("radial MLP output size mismatch at " + v.path());
    } else {
      plan.mlp = mlp(v["mlp"]);
      if (plan.mlp.dims.back() != plan.weight_numel)
        fail("radial MLP output size mismatch at " + v.path());
      if (plan.mlp.dims.front() == 0) fail("radial MLP without inputs at " + v.path());
    }
    plan.denominator = v["denominator"].as_double();
    if (!(plan.denominator > 0)) fail("convolution denominator must be positive at " + v.path());
    return plan;
  }

  GatePlan gate(const json::Value& v) {
    GatePlan plan;
    Irreps in = irreps(v["irreps_in"]);
    Irreps out = irreps(v["irreps_out"]);
    plan.dim_in = in.dim;
    plan.dim_out = out.dim;
    auto segments = [&](const json::Value& list, std::vector<GateSegment>& into) {
      for (const json::Value& s : list.array()) {
        GateSegment seg;
        seg.start = static_cast<int>(s["start"].as_int());
        seg.dim = static_cast<int>(s["dim"].as_int());
        seg.act = parse_activation(s["act"].as_string());
        seg.scale = s["scale"].as_double();
        if (seg.start < 0 || seg.start + seg.dim > plan.dim_in) fail("gate segment out of range");
        into.push_back(seg);
      }
    };
    segments(v["scalars"], plan.scalars);
    segments(v["gates"], plan.gates);
    int num_gates = 0, num_gated = 0, scalar_dim = 0;
    for (const auto& s : plan.gates) num_gates += s.dim;
    for (const auto& s : plan.scalars) scalar_dim += s.dim;
    for (const json::Value& g : v["gated"].array()) {
      GatedBlock b;
      b.start = static_cast<int>(g["start"].as_int());
      b.mul = static_cast<int>(g["mul"].as_int());
      b.l = static_cast<int>(g["l"].as_int());
      if (b.start < 0 || b.start + b.mul * (2 * b.l + 1) > plan.dim_in)
        fail("gated block out of range");
      num_gated += b.mul;
      plan.gated.push_back(b);
    }
    if (num_gates != num_gated) fail("gate at " + v.path() + ": gates and gated do not match");
    int64_t gated_dim = 0;
    for (const auto& b : plan.gated) gated_dim += b.mul * (2 * b.l + 1);
    if (scalar_dim + gated_dim != plan.dim_out)
      fail("gate at " + v.path() + ": output size mismatch");
    plan.gated_factor = v["gated_factor"].as_double();
    return plan;
  }

  ShPlan sh(const json::Value& v) {
    ShPlan plan;
    plan.lmax = static_cast<int>(v["lmax"].as_int());
    if (plan.lmax < 0 || plan.lmax > 8) fail("spherical harmonics lmax out of range");
    plan.dim = (plan.lmax + 1) * (plan.lmax + 1);
    plan.normalize = v["normalize"].as_bool();
    const json::Value& polys = v["polynomials"];
    if (polys.size() != static_cast<size_t>(plan.lmax + 1))
      fail("spherical harmonics: missing degrees");
    for (int l = 0; l <= plan.lmax; ++l) {
      ShDegree d;
      d.l = l;
      const int num_monomials = (l + 1) * (l + 2) / 2;
      const json::Value& name = polys[l]["exponents"];
      if (!file_.has(name.as_string())) fail("tensor '" + name.as_string() + "' is missing");
      std::vector<int64_t> exps = file_.to_int(name.as_string());
      if (static_cast<int>(exps.size()) != 3 * num_monomials)
        fail("bad exponents for l=" + std::to_string(l));
      for (int k = 0; k < num_monomials; ++k) {
        std::array<int, 3> e = {static_cast<int>(exps[3 * k]), static_cast<int>(exps[3 * k + 1]),
                                static_cast<int>(exps[3 * k + 2])};
        if (e[0] < 0 || e[1] < 0 || e[2] < 0 || e[0] + e[1] + e[2] != l)
          fail("bad exponents for l=" + std::to_string(l));
        d.exponents.push_back(e);
      }
      d.coeffs = tensor(polys[l]["coeffs"], {2 * l + 1, num_monomials});
      num_parameters_ -= static_cast<int64_t>(d.coeffs.size());
      plan.degrees.push_back(std::move(d));
    }
    return plan;
  }

  std::vector<int64_t> int_tensor(const json::Value& name_value) {
    const std::string name = name_value.as_string();
    if (!file_.has(name))
      fail("tensor '" + name + "' named at " + name_value.path() + " is missing");
    return file_.to_int(name);
  }
  void uncount(int64_t n) { num_parameters_ -= n; }  // constants, not parameters

  int64_t num_parameters() const { return num_parameters_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("model file '" + origin_ + "': " + what);
  }

 private:
  int block_index(const json::Value& v, const Irreps& irreps) {
    int64_t i = v.as_int();
    if (i < 0 || i >= static_cast<int64_t>(irreps.blocks.size()))
      fail("block index out of range at " + v.path());
    return static_cast<int>(i);
  }
  static std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  const SafetensorsFile& file_;
  std::string origin_;
  int64_t num_parameters_ = 0;
};

// Radial basis, envelope, spherical harmonics and the one-hot species embedding
// (shared by all families).
void build_common(PlanBuilder& b, const json::Value& arch, ModelPlan& plan) {
  const json::Value& radial = arch["radial"];
  if (radial["kind"].as_string() != "bessel")
    b.fail("radial basis '" + radial["kind"].as_string() + "'");
  plan.radial.num_basis = static_cast<int>(radial["num_basis"].as_int());
  if (plan.radial.num_basis < 1 || plan.radial.num_basis > 64)
    b.fail("number of radial basis functions must be 1..64");
  plan.radial.prefactor = radial["prefactor"].as_double();
  plan.radial.coeffs = b.tensor(radial["coeffs"], {plan.radial.num_basis});
  const json::Value& env = arch["envelope"];
  const std::string env_kind = env["kind"].as_string();
  plan.radial.r_cut = env["r_cut"].as_double();
  if (env_kind == "xplor") {
    plan.radial.envelope = EnvelopeKind::xplor;
    plan.radial.r_on = env["r_on"].as_double();
    if (!(plan.radial.r_on < plan.radial.r_cut)) b.fail("xplor envelope needs r_on < r_cut");
  } else if (env_kind == "polynomial") {
    plan.radial.envelope = EnvelopeKind::polynomial;
    plan.radial.p = env["p"].as_double();
  } else {
    b.fail("envelope '" + env_kind + "' is not supported");
  }
  plan.sh = b.sh(arch["spherical_harmonics"]);

  const int num_species = static_cast<int>(plan.atomic_numbers.size());
  LinearPlan embed = b.linear(arch["embedding"]);
  if (embed.in.blocks.size() != 1 || embed.in.blocks[0].mul != num_species ||
      embed.in.blocks[0].l != 0) {
    b.fail("embedding input must be one-hot over the model's species");
  }
  plan.embedding_dim = static_cast<int>(embed.out.dim);
  plan.embedding.assign(static_cast<size_t>(num_species) * plan.embedding_dim, 0.0);
  for (const LinearPath& p : embed.paths) {
    const IrrepBlock& bo = embed.out.blocks[p.out_block];
    if (bo.l != 0) b.fail("embedding outputs must be scalars");
    for (int s = 0; s < num_species; ++s)
      for (int w = 0; w < bo.mul; ++w)
        plan.embedding[s * plan.embedding_dim + bo.offset + w] += p.weight[s * bo.mul + w];
  }
  for (const LinearBias& bias : embed.biases) {
    const IrrepBlock& bo = embed.out.blocks[bias.out_block];
    for (int s = 0; s < num_species; ++s)
      for (int w = 0; w < bo.mul; ++w)
        plan.embedding[s * plan.embedding_dim + bo.offset + w] += bias.bias[w];
  }
}

ElementLinearPlan element_linear(PlanBuilder& b, const json::Value& v, int num_species,
                                 bool may_be_shared = false);

void build_sevennet(PlanBuilder& b, const json::Value& arch, ModelPlan& plan) {
  build_common(b, arch, plan);
  const int num_species = static_cast<int>(plan.atomic_numbers.size());
  int64_t dim = plan.embedding_dim;
  for (const json::Value& lv : arch["layers"].array()) {
    SevennetLayer layer;
    const json::Value& sc = lv["self_connection"];
    if (sc.contains("elements")) {  // self_connection_type 'nequip'
      ElementLinearPlan per_species = element_linear(b, sc, num_species);
      layer.self_connection.in = per_species.in;
      layer.self_connection.out = per_species.out;
      layer.self_connection_species = std::move(per_species.per_species);
    } else {
      layer.self_connection = b.linear(sc);
    }
    layer.linear_1 = b.linear(lv["linear_1"]);
    layer.conv = b.conv(lv["conv"], plan.sh);
    layer.linear_2 = b.linear(lv["linear_2"]);
    layer.gate = b.gate(lv["gate"]);
    if (layer.self_connection.in.dim != dim || layer.linear_1.in.dim != dim ||
        layer.linear_1.out.dim != layer.conv.in.dim ||
        layer.conv.out.dim != layer.linear_2.in.dim ||
        layer.linear_2.out.dim != layer.gate.dim_in ||
        layer.self_connection.out.dim != layer.gate.dim_in) {
      b.fail("layer " + lv.path() + ": feature sizes do not chain");
    }
    if (layer.conv.mlp.dims.empty() || layer.conv.mlp.dims.front() != plan.radial.num_basis)
      b.fail("radial MLP input != number of basis functions");
    dim = layer.gate.dim_out;
    plan.layers.push_back(std::move(layer));
  }
  for (const json::Value& rv : arch["readout"].array()) {
    LinearPlan lin = b.linear(rv);
    if (lin.in.dim != dim) b.fail("readout sizes do not chain");
    dim = lin.out.dim;
    plan.readout.push_back(std::move(lin));
  }
  if (dim != 1) b.fail("readout must end in one scalar per atom");
  plan.scale = b.tensor(arch["scale"], {num_species});
  plan.shift = b.tensor(arch["shift"], {num_species});
}

// `may_be_shared`: one map for all species is allowed (ElementLinearPlan::shared).
ElementLinearPlan element_linear(PlanBuilder& b, const json::Value& v, int num_species,
                                 bool may_be_shared) {
  ElementLinearPlan plan;
  plan.in = b.irreps(v["irreps_in"]);
  plan.out = b.irreps(v["irreps_out"]);
  const size_t maps = v["elements"].size();
  if (maps != static_cast<size_t>(num_species) && !(may_be_shared && maps == 1))
    b.fail("element linear at " + v.path() + ": one map per species expected" +
           (may_be_shared ? " (or one for all)" : ""));
  for (const json::Value& e : v["elements"].array()) {
    LinearPlan lin = b.linear(e);
    if (lin.in.dim != plan.in.dim || lin.out.dim != plan.out.dim)
      b.fail("element linear at " + e.path() + ": sizes");
    plan.per_species.push_back(std::move(lin));
  }
  return plan;
}

SymmetricContractionPlan symmetric_contraction(PlanBuilder& b, const json::Value& v,
                                               int num_species) {
  SymmetricContractionPlan plan;
  plan.in = b.irreps(v["irreps_in"]);
  plan.out = b.irreps(v["irreps_out"]);
  plan.num_features = static_cast<int>(v["num_features"].as_int());
  plan.num_ell = static_cast<int>(v["num_ell"].as_int());
  const int C = plan.num_features;
  int ell = 0;
  for (const IrrepBlock& blk : plan.in.blocks) {
    if (blk.mul != C)
      b.fail("symmetric contraction at " + v.path() + ": unequal input multiplicities");
    ell += 2 * blk.l + 1;
  }
  if (ell != plan.num_ell) b.fail("symmetric contraction at " + v.path() + ": num_ell mismatch");
  for (const json::Value& cv : v["contractions"].array()) {
    ContractionPlan c;
    c.out_block = static_cast<int>(cv["out"].as_int());
    if (c.out_block < 0 || c.out_block >= static_cast<int>(plan.out.blocks.size()))
      b.fail("bad output block at " + cv.path());
    const IrrepBlock& bo = plan.out.blocks[c.out_block];
    if (bo.mul != C) b.fail("symmetric contraction output multiplicity at " + cv.path());
    for (const json::Value& tv : cv["terms"].array()) {
      ContractionTerm t;
      t.nu = static_cast<int>(tv["nu"].as_int());
      t.num_params = static_cast<int>(tv["num_params"].as_int());
      if (t.nu < 1 || t.nu > 8 || t.num_params < 1) b.fail("bad contraction term at " + tv.path());
      std::vector<int64_t> idx = b.int_tensor(tv["index"]);
      if (idx.size() % (t.nu + 2) != 0) b.fail("bad contraction index at " + tv.path());
      const int64_t rows = static_cast<int64_t>(idx.size()) / (t.nu + 2);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t* row = &idx[r * (t.nu + 2)];
        if (row[0] < 0 || row[0] > 2 * bo.l || row[t.nu + 1] < 0 || row[t.nu + 1] >= t.num_params)
          b.fail("contraction index out of range at " + tv.path());
        for (int q = 1; q <= t.nu; ++q)
          if (row[q] < 0 || row[q] >= plan.num_ell)
            b.fail("contraction index out of range at " + tv.path());
      }
      t.index.assign(idx.begin(), idx.end());
      t.values = b.tensor(tv["values"], {rows});
      b.uncount(rows);
      t.weights = b.tensor(tv["weights"], {num_species, t.num_params, C});
      c.terms.push_back(std::move(t));
    }
    plan.contractions.push_back(std::move(c));
  }
  return plan;
}

// See JointEmbeddingPlan (plan.h) and python/e3fuse/convert/mace.py (_joint_embedding).
JointEmbeddingPlan joint_embedding(PlanBuilder& b, const json::Value& v, int embedding_dim) {
  JointEmbeddingPlan plan;
  int total = 0;
  for (const json::Value& iv : v["inputs"].array()) {
    SystemInputPlan in;
    in.name = iv["name"].as_string();
    in.key = iv["key"].as_string();
    in.default_value = iv["default"].as_double();
    in.dim = static_cast<int>(iv["dim"].as_int());
    if (in.dim < 1) b.fail("bad embedding size at " + iv.path());
    const std::string kind = iv["kind"].as_string();
    if (kind == "categorical") {
      in.categorical = true;
      in.num_classes = static_cast<int>(iv["num_classes"].as_int());
      in.offset = iv["offset"].as_double();
      if (in.num_classes < 1) b.fail("bad number of classes at " + iv.path());
      in.table = b.tensor(iv["table"], {in.num_classes, in.dim});
    } else if (kind == "continuous") {
      in.w1 = b.tensor(iv["w1"], {1, in.dim});
      in.b1 = b.tensor(iv["b1"], {in.dim});
      in.w2 = b.tensor(iv["w2"], {in.dim, in.dim});
      in.b2 = b.tensor(iv["b2"], {in.dim});
    } else {
      b.fail("system input kind '" + kind + "' at " + iv.path());
    }
    total += in.dim;
    plan.inputs.push_back(std::move(in));
  }
  if (plan.inputs.empty()) b.fail("joint embedding without inputs at " + v.path());
  plan.projection = b.tensor(v["projection"], {total, embedding_dim});
  if (v.contains("readout")) {
    plan.has_readout = true;
    plan.readout = b.linear(v["readout"]);
    if (plan.readout.in.dim != embedding_dim || plan.readout.out.dim != 1)
      b.fail("embedding readout sizes at " + v.path());
  }
  return plan;
}

// "pair_repulsion" of a MACE model (ZBL, see ops/pair_repulsion.h): constants in the
// JSON, covalent radii per species.
PairRepulsionPlan pair_repulsion(PlanBuilder& b, const json::Value& v, int num_species) {
  if (v["kind"].as_string() != "zbl")
    b.fail("pair repulsion kind '" + v["kind"].as_string() + "' at " + v.path());
  PairRepulsionPlan p;
  p.enabled = true;
  p.c = v["c"].as_double_vector();
  p.exponents = v["exponents"].as_double_vector();
  p.a_exp = v["a_exp"].as_double();
  p.a_prefactor = v["a_prefactor"].as_double();
  p.bohr = v["bohr"].as_double();
  p.coulomb = v["coulomb"].as_double();
  p.p = static_cast<double>(v["p"].as_int());
  p.covalent_radii = v["covalent_radii"].as_double_vector();
  bool ok = !p.c.empty() && p.c.size() == p.exponents.size() && p.c.size() <= 8 && p.p >= 1 &&
            p.p <= 32 && p.a_prefactor > 0 && p.bohr > 0 &&
            static_cast<int>(p.covalent_radii.size()) == num_species;
  for (double r : p.covalent_radii) ok = ok && r > 0 && std::isfinite(r);
  for (double x : {p.a_exp, p.a_prefactor, p.bohr, p.coulomb}) ok = ok && std::isfinite(x);
  for (size_t k = 0; k < p.c.size(); ++k)
    ok = ok && std::isfinite(p.c[k]) && std::isfinite(p.exponents[k]);
  if (!ok) b.fail("invalid pair repulsion constants at " + v.path());
  return p;
}

// MACE's radial options (plan.h DistanceTransform, apply_cutoff); absent keys: the defaults.
void build_mace_radial(PlanBuilder& b, const json::Value& arch, ModelPlan& plan) {
  const json::Value& radial = arch["radial"];
  if (const json::Value* ac = radial.find("apply_cutoff")) plan.radial.apply_cutoff = ac->as_bool();
  const json::Value* tv = radial.find("transform");
  if (!tv) return;
  const std::string kind = (*tv)["kind"].as_string();
  if (kind == "agnesi") {
    plan.radial.transform = DistanceTransform::agnesi;
    plan.radial.agnesi_q = (*tv)["q"].as_double();
    plan.radial.agnesi_p = (*tv)["p"].as_double();
    plan.radial.agnesi_a = (*tv)["a"].as_double();
  } else if (kind == "soft") {
    plan.radial.transform = DistanceTransform::soft;
    plan.radial.soft_alpha = (*tv)["alpha"].as_double();
  } else {
    b.fail("distance transform '" + kind + "' is not supported");
  }
  const int num_species = static_cast<int>(plan.atomic_numbers.size());
  plan.radial.covalent_radii = b.tensor((*tv)["covalent_radii"], {num_species});
  for (double rc : plan.radial.covalent_radii)
    if (!(rc > 0.0)) b.fail("distance transform: covalent radii must be positive");
}

void build_mace(PlanBuilder& b, const json::Value& arch, ModelPlan& plan) {
  build_common(b, arch, plan);
  build_mace_radial(b, arch, plan);
  const int num_species = static_cast<int>(plan.atomic_numbers.size());
  int64_t dim = plan.embedding_dim;
  for (const json::Value& lv : arch["layers"].array()) {
    MaceLayer layer;
    layer.residual = lv["residual"].as_bool();
    layer.product_sc = lv["product_sc"].as_bool();
    layer.skip = element_linear(b, lv["skip"], num_species, /*may_be_shared=*/true);
    layer.linear_up = b.linear(lv["linear_up"]);
    layer.conv = b.conv(lv["conv"], plan.sh, num_species);
    layer.linear = b.linear(lv["linear"]);
    layer.product = symmetric_contraction(b, lv["product"], num_species);
    // the convolution's output, divided by alpha + beta rho, through linear (mace's linear_1)
    // plus linear_res(u), the gate and linear_2 into the product (see MaceLayer)
    if (const json::Value* nv = lv.find("nonlinear_block")) {
      layer.nonlinear_block = true;
      layer.linear_res = b.linear((*nv)["linear_res"]);
      layer.linear_2 = b.linear((*nv)["linear_2"]);
      layer.gate = b.gate((*nv)["gate"]);
      layer.density_mlp = b.radial_mlp((*nv)["density_mlp"], num_species);
      layer.alpha = (*nv)["alpha"].as_double();
      layer.beta = (*nv)["beta"].as_double();
      if (!layer.residual || layer.linear_res.in.dim != layer.linear_up.out.dim ||
          layer.linear_res.out.dim != layer.linear.out.dim ||
          layer.gate.dim_in != layer.linear.out.dim ||
          layer.linear_2.in.dim != layer.gate.dim_out || layer.density_mlp.dims.back() != 1 ||
          layer.conv.radial_mlp.empty())
        b.fail("non-linear interaction block at " + nv->path() + ": sizes do not chain");
    } else if (!layer.conv.radial_mlp.empty()) {
      b.fail("species-dependent radial MLP outside a non-linear block at " + lv.path());
    }
    layer.product_linear = b.linear(lv["product_linear"]);
    if (const json::Value* dv = lv.find("density")) {
      layer.density = true;
      layer.density_weights = b.tensor((*dv)["weights"], {plan.radial.num_basis});
    }
    const json::Value& rv = lv["readout"];
    layer.readout.nonlinear = rv["kind"].as_string() == "nonlinear";
    if (layer.readout.nonlinear) {
      layer.readout.linear_1 = b.linear(rv["linear_1"]);
      layer.readout.linear_2 = b.linear(rv["linear_2"]);
      layer.readout.act = parse_activation(rv["act"].as_string());
      layer.readout.act_scale = rv["scale"].as_double();
      for (const IrrepBlock& blk : layer.readout.linear_1.out.blocks)
        if (blk.l != 0) b.fail("non-linear readout on non-scalars at " + rv.path());
      if (layer.readout.linear_2.in.dim != layer.readout.linear_1.out.dim ||
          layer.readout.linear_2.out.dim != 1)
        b.fail("readout sizes at " + rv.path());
    } else if (rv["kind"].as_string() == "linear") {
      layer.readout.linear_1 = b.linear(rv["linear"]);
      if (layer.readout.linear_1.out.dim != 1)
        b.fail("readout must give one scalar at " + rv.path());
    } else {
      b.fail("readout kind '" + rv["kind"].as_string() + "'");
    }
    const int64_t skip_out = layer.skip.out.dim;
    const bool chain =
        layer.linear_up.in.dim == dim && layer.linear_up.out.dim == layer.conv.in.dim &&
        layer.conv.out.dim == layer.linear.in.dim &&
        (layer.nonlinear_block ? layer.linear_2.out.dim : layer.linear.out.dim) ==
            layer.product.in.dim &&
        layer.product.out.dim == layer.product_linear.in.dim &&
        layer.readout.linear_1.in.dim == layer.product_linear.out.dim &&
        (layer.residual
             ? (layer.skip.in.dim == dim && skip_out == layer.product_linear.out.dim)
             : (layer.skip.in.dim == layer.linear.out.dim && skip_out == layer.linear.out.dim));
    if (!chain) b.fail("layer " + lv.path() + ": feature sizes do not chain");
    const std::vector<int>& mlp_dims =
        layer.nonlinear_block ? layer.conv.radial_mlp.dims : layer.conv.mlp.dims;
    if (mlp_dims.front() != plan.radial.num_basis ||
        (layer.nonlinear_block && layer.density_mlp.dims.front() != plan.radial.num_basis))
      b.fail("radial MLP input != number of basis functions");
    dim = layer.product_linear.out.dim;
    plan.mace_layers.push_back(std::move(layer));
  }
  if (plan.mace_layers.empty()) b.fail("MACE model without interactions");
  if (arch.contains("joint_embedding"))
    plan.joint_embedding = joint_embedding(b, arch["joint_embedding"], plan.embedding_dim);
  plan.e0 = b.tensor(arch["e0"], {num_species});
  plan.mace_scale = arch["scale"].as_double();
  plan.mace_shift = arch["shift"].as_double();
  if (arch.contains("pair_repulsion"))
    plan.pair_repulsion = pair_repulsion(b, arch["pair_repulsion"], num_species);
}

}  // namespace

int64_t LinearPlan::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : paths) n += static_cast<int64_t>(p.weight.size());
  for (const auto& b : biases) n += static_cast<int64_t>(b.bias.size());
  return n;
}

Activation parse_activation(const std::string& name) {
  if (name == "identity") return Activation::identity;
  if (name == "silu") return Activation::silu;
  if (name == "tanh") return Activation::tanh;
  if (name == "sigmoid") return Activation::sigmoid;
  if (name == "abs") return Activation::abs;
  if (name == "relu") return Activation::relu;
  if (name == "ssp") return Activation::ssp;
  throw Error("unsupported activation function '" + name + "'");
}

Model::~Model() = default;

std::shared_ptr<const Model> Model::load(const std::string& path) {
  return from_bytes_or_file(path, nullptr);
}

std::shared_ptr<const Model> Model::from_bytes(const std::string& bytes,
                                               const std::string& origin) {
  return from_bytes_or_file(origin, &bytes);
}

std::shared_ptr<const Model> Model::from_bytes_or_file(const std::string& origin,
                                                       const std::string* bytes) {
  SafetensorsFile file =
      bytes ? SafetensorsFile::parse(*bytes, origin) : SafetensorsFile::read(origin);
  auto it = file.metadata().find("e3fuse");
  if (it == file.metadata().end()) {
    throw Error("model file '" + origin +
                "': not an e3fuse model (no 'e3fuse' metadata); convert it with `e3fuse convert`");
  }
  json::Value arch = json::parse(it->second, "model file '" + origin + "' metadata");
  auto plan = std::make_unique<ModelPlan>();
  plan->json = it->second;
  plan->format_version = static_cast<int>(arch["format_version"].as_int());
  if (plan->format_version > kModelFormatVersion) {
    throw Error("model file '" + origin + "' has format version " +
                std::to_string(plan->format_version) + ", newer than this e3fuse (" + version() +
                ") reads (" + std::to_string(kModelFormatVersion) + "); upgrade e3fuse");
  }
  if (plan->format_version < 1) throw Error("model file '" + origin + "': invalid format version");
  plan->family = arch["family"].as_string();
  plan->cutoff = arch["cutoff"].as_double();
  if (!(plan->cutoff > 0) || !std::isfinite(plan->cutoff))
    throw Error("model file '" + origin + "': bad cutoff");
  for (int64_t z : arch["atomic_numbers"].as_int_vector())
    plan->atomic_numbers.push_back(static_cast<int>(z));
  plan->species_of_z.assign(119, -1);
  for (size_t s = 0; s < plan->atomic_numbers.size(); ++s) {
    int z = plan->atomic_numbers[s];
    if (z < 1 || z > 118)
      throw Error("model file '" + origin + "': bad atomic number " + std::to_string(z));
    if (plan->species_of_z[z] != -1)
      throw Error("model file '" + origin + "': element listed twice");
    plan->species_of_z[z] = static_cast<int>(s);
  }
  if (arch.contains("source")) {
    const json::Value& src = arch["source"];
    std::string desc;
    for (const auto& kv : src.object()) {
      if (kv.second.is_string())
        desc += (desc.empty() ? "" : ", ") + kv.first + "=" + kv.second.as_string();
    }
    plan->source_description = desc;
  }
  PlanBuilder builder(file, origin);
  if (plan->family == "sevennet") {
    build_sevennet(builder, arch, *plan);
  } else if (plan->family == "mace") {
    build_mace(builder, arch, *plan);
  } else {
    throw Error("model file '" + origin + "': model family '" + plan->family +
                "' is not supported by this build");
  }
  plan->num_parameters = builder.num_parameters();
  std::shared_ptr<Model> model(new Model());
  model->plan_ = std::move(plan);
  return model;
}

const std::string& Model::family() const { return plan_->family; }
double Model::cutoff() const { return plan_->cutoff; }
int Model::num_layers() const {
  return static_cast<int>(plan_->family == "mace" ? plan_->mace_layers.size()
                                                  : plan_->layers.size());
}
int Model::format_version() const { return plan_->format_version; }
const std::vector<int>& Model::atomic_numbers() const { return plan_->atomic_numbers; }
int Model::species_of(int z) const { return (z >= 0 && z < 119) ? plan_->species_of_z[z] : -1; }
const std::string& Model::architecture_json() const { return plan_->json; }
int64_t Model::num_parameters() const { return plan_->num_parameters; }

static std::string irreps_string(const Irreps& irreps) {
  std::string s;
  for (const auto& b : irreps.blocks) {
    if (!s.empty()) s += "+";
    s += std::to_string(b.mul) + "x" + std::to_string(b.l) + (b.parity > 0 ? "e" : "o");
  }
  return s.empty() ? "0" : s;
}

namespace {

// Text without iostreams (see Engine::describe): "%g" formats like ostream's default.
std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace

std::string Model::summary() const {
  const ModelPlan& p = *plan_;
  using std::to_string;
  std::string s;
  s += "family:        " + p.family + "\n";
  s += "format:        " + to_string(p.format_version) + "\n";
  if (!p.source_description.empty()) s += "source:        " + p.source_description + "\n";
  s += "cutoff:        " + num(p.cutoff) + " A\n";
  s += "layers:        " + to_string(p.family == "mace" ? p.mace_layers.size() : p.layers.size()) +
       "\n";
  s += "radial basis:  bessel x" + to_string(p.radial.num_basis) + ", envelope " +
       (p.radial.envelope == EnvelopeKind::xplor ? "xplor (r_on " + to_string(p.radial.r_on) + ")"
                                                 : "polynomial (p " + to_string(p.radial.p) + ")") +
       (p.radial.transform == DistanceTransform::agnesi ? ", Agnesi distance transform"
        : p.radial.transform == DistanceTransform::soft ? ", Soft distance transform"
                                                        : "") +
       (p.radial.apply_cutoff ? "" : ", envelope on the radial MLP output") + "\n";
  s += "sph. harmonics: lmax " + to_string(p.sh.lmax) + "\n";
  for (size_t t = 0; t < p.layers.size(); ++t) {
    const SevennetLayer& l = p.layers[t];
    s += "layer " + to_string(t) + ":       " + irreps_string(l.linear_1.in) + " -> conv " +
         irreps_string(l.conv.out) + " (" + to_string(l.conv.paths.size()) + " paths, radial MLP";
    for (int d : l.conv.mlp.dims) s += " " + to_string(d);
    s += ", 1/" + num(l.conv.denominator) + ") -> " + irreps_string(l.linear_2.out) + " -> gate " +
         to_string(l.gate.dim_out) +
         (l.self_connection_species.empty() ? "" : ", self-connection per species") + "\n";
  }
  for (size_t t = 0; t < p.mace_layers.size(); ++t) {
    const MaceLayer& l = p.mace_layers[t];
    s += "layer " + to_string(t) + ":       " + irreps_string(l.linear_up.in) + " -> conv " +
         irreps_string(l.conv.out) + " (" + to_string(l.conv.paths.size()) + " paths, radial MLP";
    for (int d : l.conv.mlp.dims) s += " " + to_string(d);
    if (l.nonlinear_block) {  // mace's non-linear block: RadialMLP, density MLP, gate
      for (int d : l.conv.radial_mlp.dims) s += " " + to_string(d);
      s += " (LayerNorm, species pair), 1/(" + num(l.alpha) + " + " + num(l.beta) +
           " density)) -> " + irreps_string(l.linear.out) + " + linear_res -> gate -> " +
           irreps_string(l.linear_2.out) + " -> product (correlation";
    } else {
      s += (l.density ? std::string(", 1/(1 + density)") : ", 1/" + num(l.conv.denominator)) +
           ") -> " + irreps_string(l.linear.out) + " -> product (correlation";
    }
    for (const auto& c : l.product.contractions)
      s += " " + to_string(c.terms.empty() ? 0 : c.terms.back().nu);
    s += ") -> " + irreps_string(l.product_linear.out) + (l.residual ? ", residual" : "") +
         (l.readout.nonlinear ? ", MLP readout" : ", linear readout") + "\n";
  }
  const JointEmbeddingPlan& je = p.joint_embedding;
  for (size_t i = 0; i < je.inputs.size(); ++i)
    s += "system input:  " + je.inputs[i].name + " (" + je.inputs[i].key + ")" +
         (je.folded ? " = " + num(je.values[i]) : ", default " + num(je.inputs[i].default_value)) +
         (je.has_readout ? ", with embedding readout" : "") + "\n";
  if (p.pair_repulsion.enabled)
    s += "pair repulsion: ZBL, envelope p " + num(p.pair_repulsion.p) + "\n";
  s += "elements:      " + to_string(p.atomic_numbers.size()) + " (Z =";
  for (size_t i = 0; i < p.atomic_numbers.size(); ++i) {
    if (i == 12) {
      s += " ...";
      break;
    }
    s += " " + to_string(p.atomic_numbers[i]);
  }
  s += ")\n";
  s += "parameters:    " + to_string(p.num_parameters) + "\n";
  return s;
}

}  // namespace e3fuse
