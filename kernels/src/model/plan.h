// model/plan.h: the execution plan of a model, built once from an .e3f file.
// Immutable data (irreps, paths, coefficients, weights in float64); engines make
// typed copies for their precision. The model math follows e3nn as used by sevenn
// (see python/e3fuse/convert/ for how each field is read from the source model).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace e3fuse {

// One block "mul x l" of an irreps vector, stored [mul][2l+1] at `offset`.
struct IrrepBlock {
  int mul = 0;
  int l = 0;
  int parity = 1;
  int64_t offset = 0;
  int dim() const { return mul * (2 * l + 1); }
};

struct Irreps {
  std::vector<IrrepBlock> blocks;
  int64_t dim = 0;
};

// e3nn o3.Linear: out[out_block][w, m] += sum_u weight[u][w] * in[in_block][u, m].
struct LinearPath {
  int in_block = 0;
  int out_block = 0;
  std::vector<double> weight;  // [mul_in][mul_out], path weight folded in
};
struct LinearBias {
  int out_block = 0;
  std::vector<double> bias;  // [mul_out] (scalar outputs only)
};
struct LinearPlan {
  Irreps in, out;
  std::vector<LinearPath> paths;
  std::vector<LinearBias> biases;
  int64_t num_parameters() const;
};

enum class Activation { identity, silu, tanh, sigmoid, abs, relu, ssp };
Activation parse_activation(const std::string& name);

// e3nn FullyConnectedNet with scales folded into the weights:
// h <- act(h @ W_i) * act_scale for hidden layers, the last layer linear.
struct MlpPlan {
  std::vector<int> dims;
  std::vector<std::vector<double>> weights;  // weights[i]: [dims[i]][dims[i+1]]
  Activation act = Activation::identity;
  double act_scale = 1.0;
};

// One 'uvu' path of the channelwise tensor product:
// out[out_block][u, k] += w[weight_offset + u] * sum_ij cg[i][j][k] x[in_block][u, i] Y[l2][j]
struct TensorProductPath {
  int in_block = 0, sh_block = 0, out_block = 0;
  int l1 = 0, l2 = 0, l3 = 0;
  int64_t weight_offset = 0;
  std::vector<double> cg;  // [2l1+1][2l2+1][2l3+1], path normalization folded in
};

// mace's RadialMLP (blocks.py; ESEN/FairChem style) on [emb(r) | a_src[s_j] | a_tgt[s_i]]:
// h <- silu(LayerNorm(h W_l + b_l)) for hidden layers, out = h W_last + b_last. The species
// embeddings enter the first layer only, as a bias per ordered species pair:
// pair_bias[s_i * S + s_j] = b_0 + W_src^T a_src[s_j] + W_tgt^T a_tgt[s_i] (s_i the receiver),
// so weights[0] holds only the rows of emb(r). LayerNorm: (z - mean) / sqrt(var + eps) * gamma
// + beta, var the biased variance over the layer's outputs.
struct RadialMlpPlan {
  std::vector<int> dims;                         // num_basis, hidden..., outputs
  std::vector<std::vector<double>> weights;      // [dims[l]][dims[l+1]]
  std::vector<std::vector<double>> biases;       // [dims[l+1]], layers >= 1 (biases[0] unused)
  std::vector<double> pair_bias;                 // [S * S][dims[1]]
  std::vector<std::vector<double>> gamma, beta;  // hidden layers: [dims[l+1]]
  double eps = 1e-5;
  bool empty() const { return dims.empty(); }
};

// Message passing: y_i = (1/denominator) sum_{j in N(i)} TP(x_j, Y(v_ij), MLP(emb(r_ij))).
// With radial_mlp (mace's non-linear block) the weights are radial_mlp(emb(r_ij), s_i, s_j)
// instead of mlp(emb(r_ij)) (mlp then empty).
struct ConvPlan {
  Irreps in, sh, out;
  int64_t weight_numel = 0;
  std::vector<TensorProductPath> paths;
  MlpPlan mlp;
  RadialMlpPlan radial_mlp;
  double denominator = 1.0;
};

// e3nn nn.Gate on a flat input [scalars | gates | gated]:
// output [act(scalars) | act(gates) * gated * gated_factor].
struct GateSegment {
  int start = 0;
  int dim = 0;
  Activation act = Activation::identity;
  double scale = 1.0;
};
struct GatedBlock {
  int start = 0;
  int mul = 0;
  int l = 0;
};
struct GatePlan {
  std::vector<GateSegment> scalars, gates;
  std::vector<GatedBlock> gated;
  double gated_factor = 1.0;
  int64_t dim_in = 0, dim_out = 0;
};

// self_connection_type 'linear': self_connection is an o3.Linear of x. 'nequip':
// FullyConnectedTensorProduct(x, one-hot species), i.e. one linear map per species in
// self_connection_species (as MACE's skip connection), and self_connection holds only
// the irreps (no paths).
struct SevennetLayer {
  LinearPlan self_connection, linear_1;
  ConvPlan conv;
  LinearPlan linear_2;
  GatePlan gate;
  std::vector<LinearPlan> self_connection_species;  // 'nequip'; empty for 'linear'
};

enum class EnvelopeKind { xplor, polynomial };

// MACE's distance transforms (mace/modules/radial.py): the Bessel basis is evaluated at
// x = T(r, r_0), r_0 from the covalent radii of the edge's two species, the envelope at r.
//   agnesi: x = 1 / (1 + a y^q / (1 + y^(q - p))), y = r / r_0, r_0 = (rc_s + rc_r) / 2
//   soft:   x = p_0 + (r - p_0) (1 + tanh(alpha (r - m) / (p_1 - p_0))) / 2,
//           r_0 = rc_s + rc_r, p_0 = 3 r_0 / 4, p_1 = 4 r_0 / 3, m = (p_0 + p_1) / 2
enum class DistanceTransform { none, agnesi, soft };

// Edge embedding: emb_n(r) = prefactor * sin(coeffs_n r) / r * envelope(r).
struct RadialPlan {
  int num_basis = 0;
  double prefactor = 0.0;
  std::vector<double> coeffs;
  EnvelopeKind envelope = EnvelopeKind::polynomial;
  double r_cut = 0.0;
  double r_on = 0.0;  // xplor
  double p = 6.0;     // polynomial
  // MACE only: distance transform (see DistanceTransform) and apply_cutoff = false (the
  // envelope then multiplies the radial MLP's output and the edge density, not the basis).
  DistanceTransform transform = DistanceTransform::none;
  double agnesi_q = 0.0, agnesi_p = 0.0, agnesi_a = 0.0, soft_alpha = 0.0;
  std::vector<double> covalent_radii;  // per species (model order), with a transform
  bool apply_cutoff = true;
  // The embedding depends on the species pair of the edge, not on r alone.
  bool pair_dependent() const { return transform != DistanceTransform::none; }
};

// Real spherical harmonics of the unit vector, Y_l^m(u) = sum_k coeffs[m][k] u^exponents[k].
struct ShDegree {
  int l = 0;
  std::vector<std::array<int, 3>> exponents;
  std::vector<double> coeffs;  // [2l+1][num_monomials]
};
struct ShPlan {
  bool normalize = true;  // false: Y(v) = P(v) of the raw edge vector (older sevenn models)
  int lmax = 0;
  int dim = 0;  // (lmax+1)^2
  std::vector<ShDegree> degrees;
};

// MACE (mace-torch): element-dependent linear (skip_tp with one-hot species). One entry
// per species, or a single one shared by all (the non-linear block's plain o3.Linear skip_tp:
// one copy instead of one per species, 3.5 GB of float64 for MACE-OMOL-0's 83 elements).
struct ElementLinearPlan {
  Irreps in, out;
  std::vector<LinearPlan> per_species;
  bool shared() const { return per_species.size() == 1; }
};

// One correlation order nu of one output irrep of the symmetric contraction:
// out[m][c] += sum_rows value * weights[species][k][c] * prod_j x[i_j][c],
// rows = (m, i_1..i_nu, k) with i_1 <= ... <= i_nu (permutations summed).
struct ContractionTerm {
  int nu = 0;
  int num_params = 0;
  std::vector<int32_t> index;   // [rows][nu + 2]
  std::vector<double> values;   // [rows]
  std::vector<double> weights;  // [num_species][num_params][num_features]
};
struct ContractionPlan {
  int out_block = 0;
  std::vector<ContractionTerm> terms;
};
// x is the interaction output, all blocks of multiplicity num_features, read as
// x[c][i] with i over the concatenated irreps (mace's reshape_irreps).
struct SymmetricContractionPlan {
  Irreps in, out;
  int num_features = 0, num_ell = 0;
  std::vector<ContractionPlan> contractions;
};

struct MaceReadout {
  bool nonlinear = false;
  LinearPlan linear_1, linear_2;  // linear readouts use linear_1 only
  Activation act = Activation::identity;
  double act_scale = 1.0;
};

// sc = skip(x) (residual); x_up = linear_up(x); y = conv(x_up); m = linear(y);
// m = skip(m) (non-residual); p = SC(m); x = product_linear(p) (+ sc); e += readout(x).
// mace's density blocks (RealAgnosticDensity[Residual]InteractionBlock): the convolution's sum
// is divided by 1 + rho_i instead of avg_num_neighbors (conv.denominator is then 1), with
// rho_i = sum_{j in N(i)} tanh((w . emb_ij)^2) (* envelope(r_ij) when apply_cutoff is false).
//
// mace's RealAgnosticResidualNonLinearInteractionBlock (`nonlinear_block`): sc = skip(x) with
// skip a plain linear (stored per species, all equal); u = linear_up(x); y = conv(u) with the
// conv's radial_mlp (species-pair dependent, divided by nothing: conv.denominator is 1);
// z = linear(y) / (alpha + beta rho) + linear_res(u), rho_i = sum_j tanh(density_mlp_ij^2)
// (* envelope when apply_cutoff is false); m = linear_2(gate(z)); then product as residual.
struct MaceLayer {
  bool residual = false;
  bool product_sc = false;
  bool density = false;
  std::vector<double> density_weights;  // [num_basis], e3nn's 1/sqrt(fan_in) folded in
  bool nonlinear_block = false;
  RadialMlpPlan density_mlp;  // [num_basis, hidden, 1]
  double alpha = 1.0, beta = 0.0;
  LinearPlan linear_res, linear_2;
  GatePlan gate;
  ElementLinearPlan skip;
  LinearPlan linear_up, linear, product_linear;
  ConvPlan conv;
  SymmetricContractionPlan product;
  MaceReadout readout;
};

// MACE embedding_specs (mace's GenericJointEmbedding) of per-system inputs such as the
// total charge and spin: each input q_k is embedded (categorical: a table row at
// trunc(q_k + offset); continuous: Linear-SiLU-Linear), the embeddings concatenated, and
// v = silu(projection^T concat) added to every atom's species embedding. With
// use_embedding_readout, readout(embedding[s] + v) joins the atomic reference energy e0.
// Being constant per system, both are folded into the plan by Model::with_system_inputs.
struct SystemInputPlan {
  std::string name, key;  // mace's data name (total_charge) and ASE atoms.info key (charge)
  double default_value = 0.0;
  bool categorical = false;
  int dim = 0;
  int num_classes = 0;
  double offset = 0.0;
  std::vector<double> table;           // categorical: [num_classes][dim]
  std::vector<double> w1, b1, w2, b2;  // continuous: [1][dim], [dim], [dim][dim], [dim]
};
struct JointEmbeddingPlan {
  std::vector<SystemInputPlan> inputs;  // empty: the model has no per-system inputs
  std::vector<double> projection;       // [sum of input dims][embedding_dim]
  bool has_readout = false;
  LinearPlan readout;  // embedding_dim scalars -> 1 (the selected head)
  bool folded = false;
  std::vector<double> values;  // folded values, in input order
  // folded: the species embedding and e0 without the inputs (for refolding other values)
  std::vector<double> base_embedding, base_e0;
};

// MACE's ZBL pair repulsion (mace-torch ZBLBasis, pair_repulsion=True); the formula is in
// ops/pair_repulsion.h. Part of the interaction energy: scaled by mace_scale (1 in MACE).
struct PairRepulsionPlan {
  bool enabled = false;
  std::vector<double> c, exponents;  // screening function sum_k c_k exp(-exponents_k r / a)
  double a_exp = 0.0, a_prefactor = 0.0, bohr = 0.0, coulomb = 0.0;
  double p = 6.0;                      // polynomial envelope exponent
  std::vector<double> covalent_radii;  // per species
};

struct ModelPlan {
  std::string family;
  std::string json;
  std::string source_description;
  int format_version = 0;
  double cutoff = 0.0;
  std::vector<int> atomic_numbers;
  std::vector<int> species_of_z;  // indexed by Z (0..118), -1 when absent
  int64_t num_parameters = 0;

  RadialPlan radial;
  ShPlan sh;
  std::vector<double> embedding;  // [num_species][embedding_dim]
  int embedding_dim = 0;
  std::vector<SevennetLayer> layers;
  std::vector<LinearPlan> readout;
  std::vector<double> scale, shift;  // per species

  // MACE: atomic energy e_i = e0[s_i] + scale * sum_t readout_t(x_t)_i + shift.
  std::vector<MaceLayer> mace_layers;
  std::vector<double> e0;
  double mace_scale = 1.0, mace_shift = 0.0;
  JointEmbeddingPlan joint_embedding;
  PairRepulsionPlan pair_repulsion;
};

// Values per node that each halo exchange moves (HaloExchange in e3fuse/engine.h):
// the inputs of the convolutions of layers 1 .. L-1, in forward order.
inline std::vector<int> halo_widths(const ModelPlan& plan) {
  std::vector<int> widths;
  for (size_t t = 1; t < plan.layers.size(); ++t)
    widths.push_back(static_cast<int>(plan.layers[t].conv.in.dim));
  for (size_t t = 1; t < plan.mace_layers.size(); ++t)
    widths.push_back(static_cast<int>(plan.mace_layers[t].conv.in.dim));
  return widths;
}

}  // namespace e3fuse
