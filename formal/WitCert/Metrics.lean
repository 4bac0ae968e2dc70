/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

/-!
# Metrics indexed by observation site

Mirror of `witcert_calculus.metrics`. A metric is a nominal object of the inductive family
`Metric : Site → Type`: each Python metric class is one constructor, and the observation site
is the type index. Contracts (`WitCert.Contract`) are indexed by metric *values*, so two
different metrics never unify, even though every metric's readings are carried by `Rat`; and
the same metric at two different sites lives in two different types.

## Main definitions

* `WitCert.Site`: where an error is observed (`atWrite`, `atConsume`).
* `WitCert.MetricKind`: the metric classes of the Python library, without their site.
* `WitCert.Metric`: a metric at a site; `Metric.kind`, `Metric.ofKind`, `Metric.saturation`.

## Main statements

* `WitCert.Metric.kind_injective`: at one site, a metric is determined by its kind.
* `WitCert.Metric.sigma_eq_iff`: a sited metric is identified by its site *and* its kind.
* `WitCert.Metric.sigma_ne_of_site_ne`: the same formula observed at two sites gives two
  different metrics.
* `WitCert.Metric.saturation_attentionTV`, `WitCert.Metric.saturation_nextTokenTV`: total
  variation saturates at `1`.

## Implementation notes

The constructor names are the Python class names with a lower-case first letter
(`AttentionTV` ↦ `attentionTV`); the cross-check in `tests/test_formal.py` relies on this.
-/

@[expose] public section

namespace WitCert

/-- Where an error is observed: when an entry is written, or when a read consumes it. -/
inductive Site where
  /-- Observed when the entry is written (Python `AtWrite`). -/
  | atWrite
  /-- Observed when a read consumes the entry (Python `AtConsume`). -/
  | atConsume
  deriving DecidableEq, Repr

/-- The metric classes of the library, without their site. -/
inductive MetricKind where
  /-- Relative key residual. -/
  | keyResidualRel
  /-- Absolute key residual. -/
  | keyResidualAbs
  /-- Value residual. -/
  | valueResidual
  /-- Sup-norm error of the attention logits. -/
  | logitLinf
  /-- Oscillation (max minus min) of the logit error. -/
  | logitOsc
  /-- Total variation between exact and approximate attention weights. -/
  | attentionTV
  /-- Attention mass of a learned selector. -/
  | selectorMass
  /-- Euclidean error of the attention output. -/
  | attentionOutputL2
  /-- Residual of a latent (compressed) cache. -/
  | latentResidual
  /-- Error of a recurrent state. -/
  | recurrentStateError
  /-- Per-token Euclidean error. -/
  | perTokenL2
  /-- Per-token sup-norm error. -/
  | perTokenMax
  /-- Error of a gate-weighted pooled value. -/
  | pooledError
  /-- Euclidean error of the residual stream at the current token. -/
  | residualL2
  /-- Total variation between next-token distributions. -/
  | nextTokenTV
  deriving DecidableEq, Repr

/-- A metric observed at site `s`. Each constructor is one metric; the site is the index. -/
inductive Metric : Site → Type where
  /-- Relative key residual at `s`. -/
  | keyResidualRel (s : Site) : Metric s
  /-- Absolute key residual at `s`. -/
  | keyResidualAbs (s : Site) : Metric s
  /-- Value residual at `s`. -/
  | valueResidual (s : Site) : Metric s
  /-- Sup-norm logit error at `s`. -/
  | logitLinf (s : Site) : Metric s
  /-- Logit-error oscillation at `s`. -/
  | logitOsc (s : Site) : Metric s
  /-- Attention total variation at `s`. -/
  | attentionTV (s : Site) : Metric s
  /-- Selector mass at `s`. -/
  | selectorMass (s : Site) : Metric s
  /-- Attention output error at `s`. -/
  | attentionOutputL2 (s : Site) : Metric s
  /-- Latent residual at `s`. -/
  | latentResidual (s : Site) : Metric s
  /-- Recurrent state error at `s`. -/
  | recurrentStateError (s : Site) : Metric s
  /-- Per-token Euclidean error at `s`. -/
  | perTokenL2 (s : Site) : Metric s
  /-- Per-token sup-norm error at `s`. -/
  | perTokenMax (s : Site) : Metric s
  /-- Pooled error at `s`. -/
  | pooledError (s : Site) : Metric s
  /-- Residual-stream error at `s`. -/
  | residualL2 (s : Site) : Metric s
  /-- Next-token total variation at `s`. -/
  | nextTokenTV (s : Site) : Metric s

namespace Metric

variable {s t : Site}

/-- The kind of a metric (its Python class without the site). -/
def kind : Metric s → MetricKind
  | keyResidualRel _ => .keyResidualRel
  | keyResidualAbs _ => .keyResidualAbs
  | valueResidual _ => .valueResidual
  | logitLinf _ => .logitLinf
  | logitOsc _ => .logitOsc
  | attentionTV _ => .attentionTV
  | selectorMass _ => .selectorMass
  | attentionOutputL2 _ => .attentionOutputL2
  | latentResidual _ => .latentResidual
  | recurrentStateError _ => .recurrentStateError
  | perTokenL2 _ => .perTokenL2
  | perTokenMax _ => .perTokenMax
  | pooledError _ => .pooledError
  | residualL2 _ => .residualL2
  | nextTokenTV _ => .nextTokenTV

/-- The metric of a given kind at site `s`. -/
def ofKind (s : Site) : MetricKind → Metric s
  | .keyResidualRel => keyResidualRel s
  | .keyResidualAbs => keyResidualAbs s
  | .valueResidual => valueResidual s
  | .logitLinf => logitLinf s
  | .logitOsc => logitOsc s
  | .attentionTV => attentionTV s
  | .selectorMass => selectorMass s
  | .attentionOutputL2 => attentionOutputL2 s
  | .latentResidual => latentResidual s
  | .recurrentStateError => recurrentStateError s
  | .perTokenL2 => perTokenL2 s
  | .perTokenMax => perTokenMax s
  | .pooledError => pooledError s
  | .residualL2 => residualL2 s
  | .nextTokenTV => nextTokenTV s

/-- The site of a metric: its type index. -/
def site (_ : Metric s) : Site := s

/-- The value at or above which a bound in this metric says nothing (`none`: no such value).
Total variations and selector mass are probabilities and saturate at `1`. -/
def saturation : Metric s → Option Rat
  | attentionTV _ => some 1
  | selectorMass _ => some 1
  | nextTokenTV _ => some 1
  | _ => none

/-- Rebuilding a metric from its kind gives it back. -/
theorem ofKind_kind (m : Metric s) : ofKind s m.kind = m := by
  cases m <;> rfl

/-- The kind of the metric built from a kind is that kind. -/
theorem kind_ofKind (s : Site) (k : MetricKind) : (ofKind s k).kind = k := by
  cases k <;> rfl

/-- At one site, a metric is determined by its kind. -/
theorem kind_injective {m n : Metric s} (h : m.kind = n.kind) : m = n := by
  rw [← ofKind_kind m, ← ofKind_kind n, h]

/-- A sited metric is identified by its site and its kind: the site is part of its identity. -/
theorem sigma_eq_iff {m : Metric s} {n : Metric t} :
    (⟨s, m⟩ : Σ s, Metric s) = ⟨t, n⟩ ↔ s = t ∧ m.kind = n.kind := by
  constructor
  · intro h
    cases h
    exact ⟨rfl, rfl⟩
  · rintro ⟨rfl, h⟩
    rw [kind_injective h]

/-- The same formula observed at two different sites gives two different metrics. -/
theorem sigma_ne_of_site_ne {m : Metric s} {n : Metric t} (h : s ≠ t) :
    (⟨s, m⟩ : Σ s, Metric s) ≠ ⟨t, n⟩ :=
  fun e => h (sigma_eq_iff.mp e).1

/-- Two metrics of different kinds are different, even at the same site. -/
theorem ne_of_kind_ne {m n : Metric s} (h : m.kind ≠ n.kind) : m ≠ n :=
  fun e => h (congrArg kind e)

/-- Total variation saturates at `1`. -/
theorem saturation_attentionTV (s : Site) : (attentionTV s).saturation = some 1 := rfl

/-- Selector mass saturates at `1`. -/
theorem saturation_selectorMass (s : Site) : (selectorMass s).saturation = some 1 := rfl

/-- The total variation between next-token distributions saturates at `1`. -/
theorem saturation_nextTokenTV (s : Site) : (nextTokenTV s).saturation = some 1 := rfl

/-- Every saturation value is nonnegative. -/
theorem saturation_nonneg (m : Metric s) {x : Rat} (h : m.saturation = some x) : 0 ≤ x := by
  cases m <;> simp only [saturation] at h <;> cases h <;> grind

end Metric

end WitCert

end
