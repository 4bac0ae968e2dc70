/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Metrics
public import WitCert.Tiers
public import WitCert.Contracts
public import WitCert.Bridges
public import WitCert.Ledger
public import WitCert.Analytic
public import WitCert.Meters
public import WitCert.Dither
public import WitCert.Output
public import WitCert.Sharp
public import WitCert.Witness
public import WitCert.Formats
public import WitCert.Laws
public import WitCert.Sampling
public import WitCert.Semantic
public import WitCert.Diagnosis
public import WitCert.SemanticBridges
public import WitCert.SemanticDither
public import WitCert.SemanticMeters
public import WitCert.Eviction
public import WitCert.SemanticEviction
public import WitCert.Depth
public import WitCert.SemanticDepth
public import WitCert.Audit
public import WitCert.GeneratedChecks

/-!
# WitCert

Lean 4 companion of the Python library `witcert_calculus`: one module per Python module.
See `formal/README.md` for the list of theorems and their Python counterparts.
-/
