#include "hf/gpt_oss_experts.h"

#include <fmt/format.h>

#include "core/error.h"
#include "hf/dequant.h"

namespace primus::hf {

namespace {

std::string hf_prefix(const PackedExperts& k, int64_t l) {
  return fmt::format("model.layers.{}.{}experts.", l, k.block);
}
std::string our_prefix(int64_t l, int64_t e) {
  return fmt::format("decoder.layers.{}.mlp.experts.local_experts.{}.", l, e);
}

// Column j of gate_up for our fc1 row r (gate rows first, then up rows): interleaved (gpt-oss) or
// the same (Llama 4).
int64_t column(const PackedExperts& k, int64_t r, int64_t f) {
  return !k.interleaved ? r : r < f ? 2 * r : 2 * (r - f) + 1;
}

void require_shape(const TensorEntry& e, const std::vector<int64_t>& shape) {
  if (e.shape != shape)
    fail("tensor '{}' has shape [{}], expected [{}]", e.name, fmt::join(e.shape, ", "), fmt::join(shape, ", "));
}

// A packed weight as [E, out, in] (`out_in`, MXFP4's orientation) or [E, in, out] (the unpacked
// tensor's): returns values as [E, out, in] either way.
std::vector<float> weight_out_in(const SafetensorsReader& st, const std::string& name, int64_t E, int64_t out,
                                 int64_t in, std::map<std::string, bool>& used) {
  if (st.has(name + "_blocks") || !st.has(name)) {
    const std::string b = name + "_blocks", sc = name + "_scales";
    if (!st.has(b)) fail("'{}' has neither '{}' nor '{}' (MXFP4)", name.substr(0, name.rfind('.')), name, b);
    if (in % 32 != 0) fail("'{}': MXFP4 needs the input width {} to be a multiple of 32", b, in);
    require_shape(st.entry(b), {E, out, in / 32, 16});
    require_shape(st.entry(sc), {E, out, in / 32});
    if (st.entry(b).dtype != "U8" || st.entry(sc).dtype != "U8") fail("'{}' and '{}' must be U8 (MXFP4)", b, sc);
    used[b] = used[sc] = true;
    return dequant_mxfp4(st.raw(b), st.raw(sc), E * out, in / 32, b);
  }
  require_shape(st.entry(name), {E, in, out});
  used[name] = true;
  const std::vector<float> v = st.as_f32(name);
  std::vector<float> t(v.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) t[size_t((e * out + o) * in + i)] = v[size_t((e * in + i) * out + o)];
  return t;
}

std::vector<float> bias(const SafetensorsReader& st, const std::string& name, int64_t E, int64_t n,
                        std::map<std::string, bool>& used) {
  require_shape(st.entry(name), {E, n});
  used[name] = true;
  return st.as_f32(name);
}

}  // namespace

void import_packed_experts(const PackedExperts& k, const SafetensorsReader& st, const std::string& prefix,
                           const ModelSpec& s, ParamStore& store, std::map<std::string, bool>& used,
                           const std::function<void(const std::vector<float>&, const std::string&)>& check) {
  const int64_t E = s.num_experts, h = s.hidden_size, f = s.expert_ffn();
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!s.is_moe_layer(l)) continue;
    const std::string p = prefix + hf_prefix(k, l);
    const std::vector<float> gu = weight_out_in(st, p + "gate_up_proj", E, 2 * f, h, used);  // [E, 2f, h]
    const std::vector<float> dn = weight_out_in(st, p + "down_proj", E, h, f, used);  // [E, h, f]
    std::vector<float> gub, dnb;
    if (k.biases) {
      gub = bias(st, p + "gate_up_proj_bias", E, 2 * f, used);
      dnb = bias(st, p + "down_proj_bias", E, h, used);
    }
    for (const auto& [v, name] :
         {std::pair{&gu, "gate_up_proj"}, {&gub, "gate_up_proj_bias"}, {&dn, "down_proj"}, {&dnb, "down_proj_bias"}})
      if (!v->empty()) check(*v, p + name);
    for (int64_t e = 0; e < E; ++e) {
      const std::string o = our_prefix(l, e);
      float* fc1 = store.value<float>(store.find(o + "linear_fc1.weight"));
      float* fc2 = store.value<float>(store.find(o + "linear_fc2.weight"));
      for (int64_t r = 0; r < 2 * f; ++r) std::copy_n(gu.begin() + (e * 2 * f + column(k, r, f)) * h, h, fc1 + r * h);
      std::copy_n(dn.begin() + e * h * f, h * f, fc2);
      if (!k.biases) continue;
      float* fc1b = store.value<float>(store.find(o + "linear_fc1.bias"));
      float* fc2b = store.value<float>(store.find(o + "linear_fc2.bias"));
      for (int64_t r = 0; r < 2 * f; ++r) fc1b[r] = gub[size_t(e * 2 * f + column(k, r, f))];
      std::copy_n(dnb.begin() + e * h, h, fc2b);
    }
  }
}

std::vector<TensorOut> export_packed_experts(const PackedExperts& k, const ModelSpec& s, const ParamStore& store,
                                             const std::vector<float>& values, const std::string& dtype) {
  const int64_t E = s.num_experts, h = s.hidden_size, f = s.expert_ffn();
  std::vector<TensorOut> out;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!s.is_moe_layer(l)) continue;
    std::vector<float> gu(size_t(E * h * 2 * f)), gub(size_t(E * 2 * f)), dn(size_t(E * f * h)), dnb(size_t(E * h));
    for (int64_t e = 0; e < E; ++e) {
      const std::string o = our_prefix(l, e);
      auto at = [&](const std::string& n) { return values.data() + store.infos()[size_t(store.find(o + n))].offset; };
      const float *fc1 = at("linear_fc1.weight"), *fc2 = at("linear_fc2.weight");
      for (int64_t r = 0; r < 2 * f; ++r) {
        const int64_t j = column(k, r, f);
        for (int64_t i = 0; i < h; ++i) gu[size_t((e * h + i) * 2 * f + j)] = fc1[r * h + i];
      }
      for (int64_t i = 0; i < h; ++i)
        for (int64_t c = 0; c < f; ++c) dn[size_t((e * f + c) * h + i)] = fc2[i * f + c];
      if (!k.biases) continue;
      const float *fc1b = at("linear_fc1.bias"), *fc2b = at("linear_fc2.bias");
      for (int64_t r = 0; r < 2 * f; ++r) gub[size_t(e * 2 * f + column(k, r, f))] = fc1b[r];
      std::copy_n(fc2b, h, dnb.begin() + e * h);
    }
    const std::string p = hf_prefix(k, l);
    out.push_back({p + "gate_up_proj", dtype, {E, h, 2 * f}, f32_to_bytes(gu, dtype)});
    if (k.biases) out.push_back({p + "gate_up_proj_bias", dtype, {E, 2 * f}, f32_to_bytes(gub, dtype)});
    out.push_back({p + "down_proj", dtype, {E, f, h}, f32_to_bytes(dn, dtype)});
    if (k.biases) out.push_back({p + "down_proj_bias", dtype, {E, h}, f32_to_bytes(dnb, dtype)});
  }
  return out;
}

}  // namespace primus::hf
