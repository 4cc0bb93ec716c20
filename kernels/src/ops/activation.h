// ops/activation.h: scalar activation functions and their derivatives, shared by
// the CPU and CUDA backends. Scale factors (e3nn normalize2mom) are applied by callers.
#pragma once

#include <cmath>

#include "model/plan.h"

#if defined(__CUDACC__)
#define E3F_HD __host__ __device__ __forceinline__
#else
#define E3F_HD inline
#endif

namespace e3fuse::ops {

template <class T>
E3F_HD T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Value of the activation at x.
template <class T>
E3F_HD T activation(Activation act, T x) {
  switch (act) {
    case Activation::identity:
      return x;
    case Activation::silu:
      return x * sigmoid(x);
    case Activation::tanh:
      return std::tanh(x);
    case Activation::sigmoid:
      return sigmoid(x);
    case Activation::abs:
      return std::abs(x);
    case Activation::relu:
      return x > T(0) ? x : T(0);
    case Activation::ssp:  // shifted softplus: log(1 + e^x) - log 2, computed stably
      return (x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x))) -
             T(0.6931471805599453);
  }
  return x;
}

// Derivative of the activation at x.
template <class T>
E3F_HD T activation_grad(Activation act, T x) {
  switch (act) {
    case Activation::identity:
      return T(1);
    case Activation::silu: {
      const T s = sigmoid(x);
      return s * (T(1) + x * (T(1) - s));
    }
    case Activation::tanh: {
      const T t = std::tanh(x);
      return T(1) - t * t;
    }
    case Activation::sigmoid: {
      const T s = sigmoid(x);
      return s * (T(1) - s);
    }
    case Activation::abs:
      return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    case Activation::relu:
      return x > T(0) ? T(1) : T(0);
    case Activation::ssp:
      return sigmoid(x);
  }
  return T(1);
}

}  // namespace e3fuse::ops
