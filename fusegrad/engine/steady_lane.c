/* TinyJit's steady lane as a C call: the checks, the replay's thunks and the hand-out of SteadyLane in engine/jit.py,
 * without the interpreter's frames. A jitted collective or tiny step is a microsecond of work, and the Python lane
 * costs more than that; this one costs a few dictionary lookups.
 *
 * LaneBase adds no fields, so a TinyJit instance can switch to a subclass with it among its bases (native_lane.py)
 * and keep its layout. Its call reads `c_lane` of the instance's known call, a tuple native_lane.py makes from a
 * SteadyLane (held there, it goes when the known call goes); anything it does not handle (another argument, a setting, a capture, a changed binding) goes to the Python
 * __call__ it was configured with, which handles every case. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#ifdef Py_GIL_DISABLED
#error "the lane's reference counts and unlocked reads assume the GIL: free-threaded builds keep the Python lane"
#endif

/* set once by configure() */
static PyObject *tensor_type, *capturing, *jit_var, *jit_override, *debug_var, *debug_override, *unset, *hooks,
    *counters, *python_call, *lock_acquire, *lock_release;
/* GlobalCounters' kernel_count, global_ops and global_mem: its __slots__, read and written in place */
static PyObject **counter_slot[3];
static PyObject *one;
static PyObject *s_c_lane, *s_known, *s_lane, *s_captured, *s_steady, *s_cnt, *s_uop, *s_default, *s_trace,
    *s_kernel_count, *s_global_ops, *s_global_mem, *s_hand_out, *s_grad, *s_requires_grad, *s_is_param, *s_device,
    *s_calls, *s_busy;

/* the pending exception, taken while the lock is released and put back after (3.12 replaced the three-part API) */
#if PY_VERSION_HEX >= 0x030C0000
typedef struct { PyObject *exc; } pending_t;
static pending_t take_pending(void) { return (pending_t){PyErr_GetRaisedException()}; }
static int is_pending(pending_t p) { return p.exc != NULL; }
static void put_back(pending_t p) { PyErr_SetRaisedException(p.exc); }
static void drop(pending_t p) { Py_XDECREF(p.exc); }
#else
typedef struct { PyObject *type, *value, *tb; } pending_t;
static pending_t take_pending(void) {
    pending_t p;
    PyErr_Fetch(&p.type, &p.value, &p.tb);
    return p;
}
static int is_pending(pending_t p) { return p.type != NULL; }
static void put_back(pending_t p) { PyErr_Restore(p.type, p.value, p.tb); }
static void drop(pending_t p) { Py_XDECREF(p.type), Py_XDECREF(p.value), Py_XDECREF(p.tb); }
#endif

/* the fields of a `c_lane` tuple, in order */
enum { L_LANE, L_CAP, L_STEADY, L_THUNKS, L_UOPS, L_LAUNCHES, L_OPS, L_MEM, L_UOP, L_DEVICE, L_ATTRS, L_HELD,
       L_FIELDS };

/* a setting's value as ContextVar.value reads it: the thread's override, else the default; a new reference */
static PyObject *setting(PyObject *var, PyObject *override) {
    PyObject *v = NULL;
    if (PyContextVar_Get(override, NULL, &v) < 0) return NULL;
    if (v != unset) return v;
    Py_DECREF(v);
    return PyObject_GetAttr(var, s_default);
}

/* 1 when the lane may run: JIT on, DEBUG below 2, no tracer hook, no capture going on; -1 on an error */
static int settings_allow(void) {
    if (PyList_GET_SIZE(capturing)) return 0;
    PyObject *jit = setting(jit_var, jit_override);
    if (!jit) return -1;
    int on = PyObject_IsTrue(jit);
    Py_DECREF(jit);
    if (on <= 0) return on;
    PyObject *debug = setting(debug_var, debug_override);
    if (!debug) return -1;
    long level = PyLong_Check(debug) ? PyLong_AsLong(debug) : 2;
    Py_DECREF(debug);
    if (level == -1 && PyErr_Occurred()) return -1;
    if (level >= 2) return 0;
    /* Hooks is a plain class: its attribute is an entry of its dictionary */
    PyObject *trace = PyDict_GetItemWithError(((PyTypeObject *)hooks)->tp_dict, s_trace);
    return trace == Py_None ? 1 : PyErr_Occurred() ? -1 : 0;
}

/* a borrowed attribute from an instance dictionary, NULL when missing */
static PyObject *item(PyObject *dict, PyObject *key) { return PyDict_GetItemWithError(dict, key); }

/* 1 when every argument is a Tensor over the node the lane was made for */
static int same_inputs(PyObject *args, PyObject *uops) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n != PyTuple_GET_SIZE(uops)) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        if (Py_TYPE(a) != (PyTypeObject *)tensor_type) return 0;
        PyObject *d = PyObject_GenericGetDict(a, NULL);
        if (!d) return -1;
        PyObject *u = item(d, s_uop);
        Py_DECREF(d);
        if (u != PyTuple_GET_ITEM(uops, i)) return PyErr_Occurred() ? -1 : 0;
    }
    return 1;
}

/* SteadyLane.unchanged: nobody but the lane holds t (the held list's one reference) and its attributes are as
 * tensor_of_uop made them, compared by identity */
static int free_and_unchanged(PyObject *t, PyObject *lane) {
    if (Py_REFCNT(t) != 1) return 0;
    PyObject *d = PyObject_GenericGetDict(t, NULL);
    if (!d) return -1;
    int ok = PyDict_GET_SIZE(d) == PyLong_AsSsize_t(PyTuple_GET_ITEM(lane, L_ATTRS)) &&
             item(d, s_uop) == PyTuple_GET_ITEM(lane, L_UOP) && item(d, s_grad) == Py_None &&
             item(d, s_requires_grad) == Py_None && item(d, s_is_param) == Py_True &&
             item(d, s_device) == PyTuple_GET_ITEM(lane, L_DEVICE);
    Py_DECREF(d);
    return PyErr_Occurred() ? -1 : ok;
}

/* *slot += amount, for a counter slot that holds a number */
static int add_to(PyObject **slot, PyObject *amount) {
    PyObject *sum = *slot == NULL ? NULL : PyNumber_Add(*slot, amount);
    if (!sum) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "a GlobalCounters counter is unset");
        return -1;
    }
    Py_SETREF(*slot, sum);
    return 0;
}

/* One thunk of the replay: a Python callable, or a C function's description (a thunk's `c_call`, see
 * native_lane.lane_state) called here without ctypes, the GIL released as ctypes releases it:
 *   (fn, arg): void fn(const void *arg), a batch of kernels;
 *   (fn, arg, owner, busy, n, failed): int fn(const void *arg), a blocking MPI call the watchdog watches, as
 *   World.watched runs it: owner.calls += n and owner.busy = busy around the call; a nonzero result is MPI's error
 *   code, which failed(code) raises. */
static int run_thunk(PyObject *t) {
    if (!PyTuple_CheckExact(t)) {
        PyObject *r = PyObject_CallNoArgs(t);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    void *fn = n >= 2 ? PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, 0)) : NULL;
    void *arg = n >= 2 ? PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, 1)) : NULL;
    if (PyErr_Occurred()) return -1;
    if (fn == NULL || (n != 2 && n != 6)) {
        PyErr_SetString(PyExc_ValueError, "a thunk's c_call is (fn, arg) or (fn, arg, owner, busy, n, failed)");
        return -1;
    }
    if (n == 2) {
        Py_BEGIN_ALLOW_THREADS
        ((void (*)(const void *))fn)(arg);
        Py_END_ALLOW_THREADS
        return 0;
    }
    PyObject *owner = PyTuple_GET_ITEM(t, 2), *calls = PyObject_GetAttr(owner, s_calls);
    PyObject *more = calls == NULL ? NULL : PyNumber_Add(calls, PyTuple_GET_ITEM(t, 4));
    Py_XDECREF(calls);
    int failed = more == NULL || PyObject_SetAttr(owner, s_calls, more) < 0;
    Py_XDECREF(more);
    if (failed || PyObject_SetAttr(owner, s_busy, PyTuple_GET_ITEM(t, 3)) < 0) return -1;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = ((int (*)(const void *))fn)(arg);
    Py_END_ALLOW_THREADS
    if (PyObject_SetAttr(owner, s_busy, Py_None) < 0) return -1;
    if (err == 0) return 0;
    PyObject *r = PyObject_CallFunction(PyTuple_GET_ITEM(t, 5), "i", err);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "MPI call failed with error code %d", err);
    }
    return -1;
}

/* the replay's thunks, counters and returned tensor; the realize lock is held. d: the instance's dictionary */
static PyObject *run_lane(PyObject *d, PyObject *lane) {
    PyObject *thunks = PyTuple_GET_ITEM(lane, L_THUNKS);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(thunks); i++)
        if (run_thunk(PyTuple_GET_ITEM(thunks, i)) < 0) return NULL;
    if (add_to(counter_slot[0], PyTuple_GET_ITEM(lane, L_LAUNCHES)) < 0 ||
        add_to(counter_slot[1], PyTuple_GET_ITEM(lane, L_OPS)) < 0 ||
        add_to(counter_slot[2], PyTuple_GET_ITEM(lane, L_MEM)) < 0) return NULL;
    PyObject *cnt = item(d, s_cnt);  /* self.cnt += 1 */
    PyObject *next = cnt == NULL ? NULL : PyNumber_Add(cnt, one);
    if (!next) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "TinyJit.cnt is unset");
        return NULL;
    }
    int err = PyDict_SetItem(d, s_cnt, next);
    Py_DECREF(next);
    if (err < 0) return NULL;
    /* the newest held tensor when free and unchanged, else the older (made the newest), else a new one in Python */
    PyObject *held = PyTuple_GET_ITEM(lane, L_HELD);
    Py_ssize_t n = PyList_GET_SIZE(held);
    if (n >= 1) {
        PyObject *t = PyList_GET_ITEM(held, 0);
        int ok = free_and_unchanged(t, lane);
        if (ok < 0) return NULL;
        if (ok) return Py_NewRef(t);
    }
    if (n == 2) {
        PyObject *t = PyList_GET_ITEM(held, 1);
        int ok = free_and_unchanged(t, lane);
        if (ok < 0) return NULL;
        if (ok) {
            PyList_SET_ITEM(held, 1, PyList_GET_ITEM(held, 0));
            PyList_SET_ITEM(held, 0, t);
            return Py_NewRef(t);
        }
    }
    return PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(lane, L_LANE), s_hand_out);
}

/* the known call's lane tuple (borrowed, from the known call's dictionary) when it is still the known call's lane and
 * the instance's capture is the one it was made for; NULL when not (or on an error: PyErr_Occurred says) */
static PyObject *current_lane(PyObject *d) {
    PyObject *known = item(d, s_known);
    if (known == NULL || known == Py_None) return NULL;
    PyObject *kd = PyObject_GenericGetDict(known, NULL);
    if (!kd) return NULL;
    PyObject *lane = item(kd, s_c_lane);
    int ok = lane != NULL && PyTuple_CheckExact(lane) && PyTuple_GET_SIZE(lane) == L_FIELDS &&
             item(kd, s_lane) == PyTuple_GET_ITEM(lane, L_LANE) && item(d, s_captured) == PyTuple_GET_ITEM(lane, L_CAP);
    Py_DECREF(kd);  /* the instance holds the known call, which holds the tuple */
    return ok && !PyErr_Occurred() ? lane : NULL;
}

static PyObject *python_path(PyObject *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *full = PyTuple_New(n + 1);
    if (!full) return NULL;
    PyTuple_SET_ITEM(full, 0, Py_NewRef(self));
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(full, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    PyObject *r = PyObject_Call(python_call, full, kwargs);
    Py_DECREF(full);
    return r;
}

/* 1 when the lane may run this call: the arguments are its inputs and the settings allow it; -1 on an error */
static int lane_applies(PyObject *lane, PyObject *args) {
    int ok = same_inputs(args, PyTuple_GET_ITEM(lane, L_UOPS));
    if (ok > 0) ok = settings_allow();
    return ok;
}

/* the lane's run with the realize lock held, which is released whatever happened; NULL without an exception when the
 * replay was rebound since (by another thread's call): Python's path then rebuilds the lane */
static PyObject *locked_run(PyObject *d, PyObject *lane) {
    PyObject *got = PyObject_CallNoArgs(lock_acquire);
    if (!got) return NULL;
    Py_DECREF(got);
    PyObject *ret = NULL;
    PyObject *steady = PyObject_GetAttr(PyTuple_GET_ITEM(lane, L_CAP), s_steady);
    if (steady != NULL && steady == PyTuple_GET_ITEM(lane, L_STEADY)) ret = run_lane(d, lane);
    Py_XDECREF(steady);
    pending_t pending = take_pending();
    PyObject *released = PyObject_CallNoArgs(lock_release);
    if (!released) {  /* the release's own error wins */
        drop(pending);
        Py_XDECREF(ret);
        return NULL;
    }
    Py_DECREF(released);
    if (is_pending(pending)) {
        Py_XDECREF(ret);
        put_back(pending);
        return NULL;
    }
    return ret;
}

static PyObject *lane_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (python_call == NULL || (kwargs && PyDict_GET_SIZE(kwargs))) return python_path(self, args, kwargs);
    PyObject *d = PyObject_GenericGetDict(self, NULL);
    if (!d) return NULL;
    PyObject *lane = current_lane(d);
    Py_XINCREF(lane);  /* held: a thunk's Python code may replace the known call */
    int ok = lane == NULL ? (PyErr_Occurred() ? -1 : 0) : lane_applies(lane, args);
    PyObject *ret = ok > 0 ? locked_run(d, lane) : NULL;
    Py_XDECREF(lane);
    Py_DECREF(d);
    if (ok < 0 || (ret == NULL && PyErr_Occurred())) return NULL;
    return ret != NULL ? ret : python_path(self, args, kwargs);
}

static PyTypeObject LaneBase = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fusegrad_steady_lane.LaneBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_call = lane_call,
    .tp_doc = "A TinyJit's call through its steady lane in C; everything else goes to the Python __call__.",
    .tp_new = PyType_GenericNew,
};

static PyObject *configure(PyObject *mod, PyObject *args) {
    PyObject *lock;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &tensor_type, &capturing, &jit_var, &debug_var, &unset, &hooks,
                          &counters, &python_call, &lock))
        return NULL;
    if (!PyType_Check(tensor_type) || !PyList_Check(capturing)) {
        python_call = NULL;
        PyErr_SetString(PyExc_TypeError, "configure(Tensor, capturing list, JIT, DEBUG, unset, Hooks, counters, "
                                         "call, lock)");
        return NULL;
    }
    PyObject *objs[] = {tensor_type, capturing, jit_var, debug_var, unset, hooks, counters, python_call};
    for (int i = 0; i < 8; i++) Py_INCREF(objs[i]);
    if (!(jit_override = PyObject_GetAttrString(jit_var, "_override")) ||
        !(debug_override = PyObject_GetAttrString(debug_var, "_override")) ||
        !(lock_acquire = PyObject_GetAttrString(lock, "acquire")) ||
        !(lock_release = PyObject_GetAttrString(lock, "release"))) {
        python_call = NULL;
        return NULL;
    }
    PyObject *names[] = {s_kernel_count, s_global_ops, s_global_mem};
    for (int i = 0; i < 3; i++) {
        PyObject *descr = PyDict_GetItemWithError(Py_TYPE(counters)->tp_dict, names[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            python_call = NULL;
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "GlobalCounters.%U is not a __slots__ entry", names[i]);
            return NULL;
        }
        counter_slot[i] = (PyObject **)((char *)counters + ((PyMemberDescrObject *)descr)->d_member->offset);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Bind the objects the lane reads; once, before any call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fusegrad_steady_lane", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fusegrad_steady_lane(void) {
    const char *names[] = {"c_lane",  "_known",     "lane",       "captured",   "_steady",  "cnt",           "_uop",
                           "default", "trace",      "kernel_count", "global_ops", "global_mem", "hand_out", "grad",
                           "requires_grad", "is_param", "device", "calls", "busy"};
    PyObject **slots[] = {&s_c_lane,  &s_known,      &s_lane,       &s_captured,     &s_steady,     &s_cnt,
                          &s_uop,     &s_default,    &s_trace,      &s_kernel_count, &s_global_ops, &s_global_mem,
                          &s_hand_out, &s_grad,      &s_requires_grad, &s_is_param,  &s_device,     &s_calls,
                          &s_busy};
    for (int i = 0; i < 19; i++)
        if (!(*slots[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    if (!(one = PyLong_FromLong(1))) return NULL;
    if (PyType_Ready(&LaneBase) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "LaneBase", (PyObject *)&LaneBase) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
