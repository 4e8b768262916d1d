//! One walk over a Python value before it is dumped to JSON, for two questions.
//!
//! **Is there a NaN or infinite float?** pydantic-core has no single answer for such a float: a
//! field typed `float` (in the model, a nested model, a dataclass, a `list[float]`) is written as
//! `null` whatever the serializer's config says, because a model instance is written by its own
//! class's prebuilt serializer, while a value typed `Any` follows the config. A `null` stored in
//! place of the float is a silent change (the caller still holds the float), so the stored forms
//! (`tenxgraph._state_codec`) look first, here, and refuse such a value by name.
//!
//! **Would a load give back something else?** A value where the model declares `Any` (or
//! `dict[str, Any]`, `list`, ...) comes back from its JSON as plain JSON types: a tuple as a list,
//! an int dict key as a str, a datetime or an enum as its text, a model or a dataclass as a dict.
//! A field declared `exclude=True` is not written at all. The live state a graph keeps between
//! runs (`tenxgraph._live_states`) must be what a load would give the next turn, so a run whose
//! commits held such a value keeps none. Walked in Rust: a message is some fifty objects, and the
//! walk runs for every message and state a run stores.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple, PyType};
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Deeper than any document the engine stores (its JSON parser stops at 128 levels): past this,
/// values are not looked into, and the engine's own depth check answers for them.
const MAX_DEPTH: usize = 256;

enum Seg<'py> {
    Root,
    Key(Bound<'py, PyAny>),
    /// A field of a pydantic model: (the model, the field's name).
    Field(Bound<'py, PyAny>, Bound<'py, PyAny>),
    Index(usize),
}

/// What the walk found: the path (`"blob.x"`, `"metadata.scores[1]"`) and the text of the first
/// NaN or infinity, and whether a JSON round trip would change the value (see the module doc).
pub(super) struct Found {
    pub(super) nonfinite: Option<(String, String)>,
    pub(super) reshaped: bool,
}

/// Walks `value`: dicts, lists, tuples, sets, pydantic models (their fields and extras) and
/// dataclasses. A top-level field named `skip` is left out (a step stores a state's `context` as
/// message rows, each walked on its own), and so is a NaN under a model field declared
/// `exclude=True`, which no dump writes (checked only for a find: it is rare). Stops at the
/// first NaN.
///
/// With `exact_ints`, an int past 64 bits is a find too (its text: `INT_PAST_64`): a state is
/// parsed by the engine, whose JSON numbers keep i64 and u64 exactly and turn any other int
/// into a float (a message is stored as its text, and keeps it).
pub(super) fn walk<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
    skip: Option<&str>,
    exact_ints: bool,
) -> PyResult<Found> {
    let base_model = base_model(py)?;
    let mut reshaped = false;
    // Each entry: where a value sits (parent entry, segment), read back only to name a find.
    let mut trail: Vec<(usize, Seg<'py>)> = vec![(0, Seg::Root)];
    // (value, depth, trail entry, loose): `loose`, the value sits where the model declares no
    // type a load would restore it to (under an `Any`, a bare `dict`, a model's extras).
    let mut stack: Vec<(Bound<'py, PyAny>, usize, usize, bool)> = vec![(value.clone(), 0, 0, false)];
    // Containers already walked (shared or cyclic ones are walked once), by address.
    let mut seen: HashSet<usize, BuildHasherDefault<AddrHasher>> = HashSet::default();
    while let Some((v, depth, at, loose)) = stack.pop() {
        if let Ok(f) = v.cast::<PyFloat>() {
            let x = f.value();
            if !x.is_finite() && !excluded(py, &trail, at)? {
                return Ok(Found { nonfinite: Some((path(&trail, at), format!("{x}"))), reshaped });
            }
            reshaped |= loose && !v.is_exact_instance_of::<PyFloat>();
            // PostgreSQL's jsonb writes numbers its own way: -0.0 comes back 0.0, and a float
            // written with an exponent (1.2345678901234568e16, 2.5e20: pydantic's form from 1e16
            // on) comes back as its digits, an int for a load where no type is declared.
            reshaped |= (x == 0.0 && x.is_sign_negative()) || (loose && x.abs() >= 1e16 && x.fract() == 0.0);
            continue;
        }
        if exact_ints && v.is_instance_of::<PyInt>() && !fits_64_bits(&v) && !excluded(py, &trail, at)? {
            return Ok(Found { nonfinite: Some((path(&trail, at), INT_PAST_64.into())), reshaped });
        }
        if depth >= MAX_DEPTH || is_leaf(&v, exact_ints) || v.is_instance_of::<PyBytes>() {
            reshaped |= loose && !is_json_leaf(&v);
            continue;
        }
        // Strings, ints and None (most of a message) get no trail entry and no stack slot; where
        // loose, only their exact type is looked at (a str enum comes back a str).
        let mut push =
            |child: Bound<'py, PyAny>, seg: Seg<'py>, loose: bool, stack: &mut Vec<_>, reshaped: &mut bool| {
                if is_leaf(&child, exact_ints) {
                    *reshaped |= loose && !is_json_leaf(&child);
                } else {
                    trail.push((at, seg));
                    stack.push((child, depth + 1, trail.len() - 1, loose));
                }
            };
        let top = depth == 0;
        if let Ok(d) = v.cast::<PyDict>() {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            // Where a type is declared, the load restores a dict's key type (`dict[int, str]`).
            // Its values are taken as loose either way: a `dict[str, Model]` field is then never
            // kept, where the other mistake would keep one a load would not give back.
            reshaped |= loose
                && (!v.is_exact_instance_of::<PyDict>()
                    || d.keys().iter().any(|k| !k.is_exact_instance_of::<PyString>()));
            for (k, child) in d.iter() {
                push(child, Seg::Key(k), true, &mut stack, &mut reshaped);
            }
        } else if let Ok(l) = v.cast::<PyList>() {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            reshaped |= loose && !v.is_exact_instance_of::<PyList>();
            for (i, child) in l.iter().enumerate() {
                push(child, Seg::Index(i), loose, &mut stack, &mut reshaped);
            }
        } else if let Ok(t) = v.cast::<PyTuple>() {
            reshaped |= loose;
            for (i, child) in t.iter().enumerate() {
                push(child, Seg::Index(i), loose, &mut stack, &mut reshaped);
            }
        } else if v.is_instance_of::<PySet>() || v.is_instance_of::<PyFrozenSet>() {
            reshaped |= loose;
            for (i, child) in v.try_iter()?.enumerate() {
                push(child?, Seg::Index(i), loose, &mut stack, &mut reshaped);
            }
        } else if is_model(&v, base_model) {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            // A model where none is declared comes back a dict; one with an `exclude=True`
            // field comes back without that field's value.
            let shape = shape_of(py, &v.get_type())?;
            reshaped |= loose || shape.excludes;
            // Where a field declares plain classes (`str`, `int`, `float`, `Point | None`), a load
            // gives back exactly one of them: a str enum or str subclass, an IntEnum or a bool in
            // an `int` field, an int in a `float` field, a subclass of the declared model were
            // written as the declared type and come back as it; so do the items of a sequence of
            // such classes (`list[Point]`).
            let exact = shape.exact.as_ref();
            if let Ok(fields) = v.getattr(pyo3::intern!(py, "__dict__"))
                && let Ok(fields) = fields.cast::<PyDict>()
            {
                for (k, child) in fields.iter() {
                    if top && skip.is_some() && k.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) == skip {
                        continue;
                    }
                    let loose = shape.loose.contains(&k)?;
                    if !loose
                        && !child.is_none()
                        && let Some(exact) = exact
                        && let Some(types) = exact.get_item(&k)?
                    {
                        reshaped |= !matches_spec(&child, &types)?;
                    }
                    push(child, Seg::Field(v.clone(), k), loose, &mut stack, &mut reshaped);
                }
            }
            if let Ok(extra) = v.getattr(pyo3::intern!(py, "__pydantic_extra__"))
                && let Ok(extra) = extra.cast::<PyDict>()
            {
                for (k, child) in extra.iter() {
                    push(child, Seg::Key(k), true, &mut stack, &mut reshaped);
                }
            }
        } else if let Some(names) = dataclass_fields(py, &v)? {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            // Its fields' types are not looked at: only where a dataclass is declared does it
            // come back one, and then its values as the dataclass's validator makes them.
            reshaped |= loose;
            for name in names.iter() {
                let Ok(text) = name.cast::<PyString>() else { continue };
                if let Ok(child) = v.getattr(text) {
                    push(child, Seg::Key(name), loose, &mut stack, &mut reshaped);
                }
            }
        } else {
            // A datetime, an enum, a UUID, a Decimal, bytes...: their text where a type is declared
            // is read back into that type; where loose, it stays text.
            reshaped |= loose;
        }
    }
    Ok(Found { nonfinite: None, reshaped })
}

/// What a load restores of a model class (`tenxgraph._round_trip.model_shape`): its fields
/// declared loosely (`Any` somewhere in the type, a bare container, no annotation), whether an
/// instance may come back as another value (an `exclude=True` field, a custom serializer, an
/// alias-only field), and, by field, the classes a load gives back where a field declares plain
/// classes only (None when no field does). Computed once per class and kept with a reference to
/// the class (so no other class can ever reuse its address): one lookup per model walked.
struct ShapeRef<'py> {
    loose: Bound<'py, PyFrozenSet>,
    excludes: bool,
    exact: Option<Bound<'py, PyDict>>,
}

/// Classes `shape_of` remembers at most.
const SHAPES_MAX: usize = 256;

fn shape_of<'py>(py: Python<'py>, cls: &Bound<'py, PyType>) -> PyResult<ShapeRef<'py>> {
    static SHAPES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    static COMPUTE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let shapes = SHAPES.get_or_init(py, || PyDict::new(py).unbind()).bind(py);
    let got = match shapes.get_item(cls)? {
        Some(got) => got,
        None => {
            let compute = COMPUTE.import(py, "tenxgraph._round_trip", "model_shape")?;
            // A class whose annotations cannot be read counts as one a load changes: that costs
            // its threads a load per turn, never a commit.
            let got = compute.call1((cls,)).unwrap_or_else(|_| {
                (PyFrozenSet::empty(py).expect("an empty frozenset"), true, py.None())
                    .into_pyobject(py)
                    .expect("a tuple")
                    .into_any()
            });
            // Keyed by the class, the cache keeps it alive: a process that makes a state class
            // per request kept every one (soak red-team, session 35). Cleared when full, as the
            // Python side's class caches are (`_required_nulls.CLASS_CACHE_SIZE`).
            if shapes.len() >= SHAPES_MAX {
                shapes.clear();
            }
            shapes.set_item(cls, &got)?;
            got
        }
    };
    let (loose, excludes, exact): (Bound<'py, PyFrozenSet>, bool, Option<Bound<'py, PyDict>>) = got.extract()?;
    Ok(ShapeRef { loose, excludes, exact })
}

/// Whether a load gives back `v` as it is, for a field whose `model_shape` spec is `spec`: a
/// tuple of classes (`v`'s exact class is one of them), or `[containers, items]` for a sequence
/// of such classes (`list[Point]`): `v` is exactly one of the containers and each item not None
/// is exactly one of the item classes.
fn matches_spec(v: &Bound<'_, PyAny>, spec: &Bound<'_, PyAny>) -> PyResult<bool> {
    let exactly = |v: &Bound<'_, PyAny>, classes: &Bound<'_, PyTuple>| {
        let ty = v.get_type();
        classes.iter().any(|t| t.as_ptr() == ty.as_ptr())
    };
    if let Ok(classes) = spec.cast::<PyTuple>() {
        return Ok(exactly(v, classes));
    }
    let spec = spec.cast::<PyList>()?;
    let containers = spec.get_item(0)?.cast_into::<PyTuple>()?;
    let items = spec.get_item(1)?.cast_into::<PyTuple>()?;
    if !exactly(v, &containers) {
        return Ok(false);
    }
    for item in v.try_iter()? {
        let item = item?;
        if !item.is_none() && !exactly(&item, &items) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// None, a str or an int (bool included): nothing to look into, nothing that can be NaN. With
/// `exact_ints`, an int past 64 bits is not: it goes on the stack, where the walk names it.
fn is_leaf(v: &Bound<'_, PyAny>, exact_ints: bool) -> bool {
    v.is_none() || v.is_instance_of::<PyString>() || (v.is_instance_of::<PyInt>() && (!exact_ints || fits_64_bits(v)))
}

/// The text of a find that is an int past 64 bits (see `walk`).
pub(super) const INT_PAST_64: &str = "an integer past 64 bits";

/// An int the engine's JSON numbers hold exactly: from i64's least to u64's greatest.
fn fits_64_bits(v: &Bound<'_, PyAny>) -> bool {
    v.extract::<i64>().is_ok() || v.extract::<u64>().is_ok()
}

/// A leaf that comes back from JSON as itself: not a str or int subclass (an enum), not bytes.
fn is_json_leaf(v: &Bound<'_, PyAny>) -> bool {
    v.is_none()
        || v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyInt>()
        || v.is_exact_instance_of::<PyBool>()
}

/// An instance of a `BaseModel` subclass, by the type's MRO alone: `isinstance` would go through
/// pydantic's metaclass (an `ABCMeta`) and its `__instancecheck__`.
fn is_model(v: &Bound<'_, PyAny>, base_model: &Bound<'_, PyType>) -> bool {
    // SAFETY: both pointers are live type objects for the duration of the call (held by `v`
    // and by the module-level `BaseModel`); PyType_IsSubtype only reads their MROs.
    unsafe { pyo3::ffi::PyType_IsSubtype(v.get_type_ptr(), base_model.as_type_ptr()) != 0 }
}

/// Addresses hashed as they are: they are unique while the walk holds the objects, and
/// SipHash's cost was a visible part of a walk.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        // Objects are 16-byte aligned: the low bits carry nothing.
        self.0 = (n as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The field names of a dataclass instance (not of a dataclass type), else None.
fn dataclass_fields<'py>(py: Python<'py>, v: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
    if v.is_instance_of::<PyType>() {
        return Ok(None);
    }
    let Some(fields) = v.get_type().getattr_opt(pyo3::intern!(py, "__dataclass_fields__"))? else {
        return Ok(None);
    };
    Ok(fields.cast::<PyDict>().ok().map(|f| f.keys()))
}

fn base_model(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static CLS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLS.import(py, "pydantic", "BaseModel")
}

/// Whether the value at `at` sits under a model field declared `exclude=True`.
fn excluded(py: Python<'_>, trail: &[(usize, Seg<'_>)], mut at: usize) -> PyResult<bool> {
    while at != 0 {
        let (parent, seg) = &trail[at];
        if let Seg::Field(model, name) = seg {
            let fields = model.get_type().getattr_opt(pyo3::intern!(py, "__pydantic_fields__"))?;
            if let Some(info) = fields.and_then(|f| f.get_item(name).ok())
                && info.getattr_opt(pyo3::intern!(py, "exclude"))?.is_some_and(|e| e.is_truthy().unwrap_or(false))
            {
                return Ok(true);
            }
        }
        at = *parent;
    }
    Ok(false)
}

fn path(trail: &[(usize, Seg<'_>)], mut at: usize) -> String {
    let mut segs = Vec::new();
    while at != 0 {
        let (parent, seg) = &trail[at];
        segs.push(seg);
        at = *parent;
    }
    let mut out = String::new();
    for seg in segs.into_iter().rev() {
        match seg {
            Seg::Key(k) | Seg::Field(_, k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                match k.str() {
                    Ok(k) => out.push_str(&k.to_string_lossy()),
                    Err(_) => out.push('?'),
                }
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Root => {}
        }
    }
    if out.is_empty() { "the value itself".to_string() } else { out }
}
