//! Black-box end-to-end scenarios (see `tests/`): the product as users install it, observed only
//! through the Kubernetes API and what the model sources served. No `cmd/*` crate is a
//! dependency.
