/* The C twins of fold_py and rearm_py (aiostream_ckpt/runtime/windowing/session_fold.py).
 *
 * Same arguments, same steps on the same Python objects, same results: read
 * the Python versions first, they are the specification. Anything off the
 * common path (a type that is not an exact int, list or tuple; a number that
 * needs more than 62 bits) returns the index to the caller, who does that
 * record or timer in Python. References: every object read out of a
 * container is held (INCREF) across calls into user code, which may change
 * the containers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define LIMIT (1LL << 61)

/* An exact int within +-2**61 (so sums with another stay in range) into *out. */
static int small_int(PyObject *o, long long *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || v > LIMIT || v < -LIMIT) return 0;
    *out = v;
    return 1;
}

/* A bound only compared with small ints (a watermark) into *out: one past +-2**61 stands
 * for any beyond, so MIN_WATERMARK (-2**63, before the first watermark) compares the same. */
static int bound_int(PyObject *o, long long *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow < 0 || v < -LIMIT) v = -LIMIT - 1;
    if (overflow > 0 || v > LIMIT) v = LIMIT + 1;
    *out = v;
    return 1;
}

static void note_failed(PyObject *failed, Py_ssize_t i) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *idx = PyLong_FromSsize_t(i);
    if (idx != NULL) {
        if (PyList_Append(failed, idx) < 0) PyErr_Clear();
        Py_DECREF(idx);
    } else {
        PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
}

/* fold(batch, i, held, key_selector, timestamp, add, gap, after, added, failed) -> int
 * add None: a count (acc + 1). */
static PyObject *fold(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "fold() takes 10 arguments");
        return NULL;
    }
    PyObject *batch = args[0], *held = args[2], *ks = args[3], *tsf = args[4], *add = args[5];
    PyObject *added = args[8], *failed = args[9];
    if (!PyList_CheckExact(batch) || !PyDict_CheckExact(held) || !PyList_CheckExact(added)
        || !PyList_CheckExact(failed)) {
        PyErr_SetString(PyExc_TypeError, "fold(): batch, added, failed: list; held: dict");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    long long gap, after;
    if (!small_int(args[6], &gap) || !bound_int(args[7], &after)) {
        if (PyErr_Occurred()) return NULL;
        return PyLong_FromSsize_t(i); /* the caller's Python path does them all */
    }
    /* As in Python: the length at the call, and batch[i] (from the end for a negative i,
     * IndexError if user code shortened the batch), never a read past its items. */
    Py_ssize_t n = PyList_GET_SIZE(batch);
    for (; i < n; i++) {
        PyObject *key = NULL, *tso = NULL, *sessions = NULL, *s = NULL;
        PyObject *rec = PySequence_GetItem(batch, i);
        if (rec == NULL) goto error;
        key = PyObject_CallOneArg(ks, rec);
        if (key == NULL) goto error;
        tso = PyObject_CallOneArg(tsf, rec);
        if (tso == NULL) goto error;
        long long ts, start, end;
        sessions = PyDict_GetItemWithError(held, key); /* before ts's type, as in Python */
        if (sessions == NULL) {
            if (PyErr_Occurred()) goto error;
            goto python;
        }
        Py_INCREF(sessions);
        if (!small_int(tso, &ts) || !PyList_CheckExact(sessions) || PyList_GET_SIZE(sessions) != 1)
            goto python;
        s = PyList_GET_ITEM(sessions, 0);
        Py_INCREF(s);
        if (!PyTuple_CheckExact(s) || PyTuple_GET_SIZE(s) != 3) goto python;
        PyObject *so = PyTuple_GET_ITEM(s, 0), *eo = PyTuple_GET_ITEM(s, 1);
        PyObject *acc = PyTuple_GET_ITEM(s, 2);
        if (!small_int(so, &start) || !small_int(eo, &end)) goto python;
        if (!(ts <= end && end > after && start <= ts + gap)) goto python;
        PyObject *nacc;
        long long count;
        if (add == Py_None && small_int(acc, &count)) {
            nacc = PyLong_FromLongLong(count + 1); /* CountAggregate.add, without its frame */
        } else if (add == Py_None) {
            goto python;
        } else {
            PyObject *call[2] = {rec, acc};
            nacc = PyObject_Vectorcall(add, call, 2, NULL);
        }
        if (nacc == NULL) goto error;
        PyObject *t = PyTuple_New(3);
        if (t == NULL || PyList_Append(added, nacc) < 0) {
            Py_XDECREF(t);
            Py_DECREF(nacc);
            goto error;
        }
        PyObject *nstart = ts < start ? tso : so;
        PyObject *nend;
        if (ts + gap > end) {
            nend = PyLong_FromLongLong(ts + gap);
            if (nend == NULL) {
                Py_DECREF(t);
                Py_DECREF(nacc);
                goto error;
            }
        } else {
            nend = eo;
            Py_INCREF(nend);
        }
        Py_INCREF(nstart);
        PyTuple_SET_ITEM(t, 0, nstart);
        PyTuple_SET_ITEM(t, 1, nend);
        PyTuple_SET_ITEM(t, 2, nacc); /* the tuple takes the references */
        /* sessions[0] = t, as in Python (IndexError if add() emptied the list) */
        if (PyList_SetItem(sessions, 0, t) < 0) goto error; /* steals t */
        Py_DECREF(s);
        Py_DECREF(sessions);
        Py_DECREF(tso);
        Py_DECREF(key);
        Py_DECREF(rec);
        continue;
    python:
        Py_XDECREF(s);
        Py_XDECREF(sessions);
        Py_XDECREF(tso);
        Py_XDECREF(key);
        Py_DECREF(rec);
        break;
    error:
        Py_XDECREF(s);
        Py_XDECREF(sessions);
        Py_XDECREF(tso);
        Py_XDECREF(key);
        Py_XDECREF(rec);
        note_failed(failed, i);
        return NULL;
    }
    return PyLong_FromSsize_t(i);
}

/* One timer of rearm(): 1 done (dead, or moved), 0 the caller's, -1 an error. */
static int rearm_one(PyObject *entry, PyObject *armed, PyObject *held, PyObject *buckets,
                     long long watermark, long long bits) {
    PyObject *tso = PyTuple_GET_ITEM(entry, 0), *key = PyTuple_GET_ITEM(entry, 1);
    long long ts, t, end;
    if (!small_int(tso, &ts)) return 0;
    PyObject *cur = PyDict_GetItemWithError(armed, key);
    if (cur == NULL) return PyErr_Occurred() ? -1 : 1; /* dead: it fired */
    if (!small_int(cur, &t)) return 0;
    if (t != ts) return 1; /* dead: an earlier time was set since */
    PyObject *sessions = PyDict_GetItemWithError(held, key);
    if (sessions == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyList_CheckExact(sessions) || PyList_GET_SIZE(sessions) != 1) return 0;
    PyObject *s = PyList_GET_ITEM(sessions, 0);
    if (!PyTuple_CheckExact(s) || PyTuple_GET_SIZE(s) < 2) return 0;
    if (!small_int(PyTuple_GET_ITEM(s, 1), &end)) return 0;
    long long later = end - 1;
    if (later <= ts || later <= watermark || later < 0) return 0;
    PyObject *n = PyLong_FromLongLong(later >> bits);
    if (n == NULL) return -1;
    PyObject *bucket = PyDict_GetItemWithError(buckets, n); /* int keys: no user code */
    Py_DECREF(n);
    if (bucket == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyList_CheckExact(bucket)) return 0;
    /* Held from here: the tuple below may start a collection whose finalizers run user
     * code (it may drop the bucket), and the store below may run a key's __eq__. */
    Py_INCREF(bucket);
    PyObject *lo = PyLong_FromLongLong(later);
    PyObject *pair = lo == NULL ? NULL : PyTuple_Pack(2, lo, key);
    if (pair == NULL) {
        Py_XDECREF(lo);
        Py_DECREF(bucket);
        return -1;
    }
    int bad = PyDict_SetItem(armed, key, lo) < 0 || PyList_Append(bucket, pair) < 0;
    Py_DECREF(bucket);
    Py_DECREF(pair);
    Py_DECREF(lo);
    return bad ? -1 : 1;
}

/* rearm(run, i, armed, held, buckets, watermark, bits) -> int */
static PyObject *rearm(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "rearm() takes 7 arguments");
        return NULL;
    }
    PyObject *run = args[0], *armed = args[2], *held = args[3], *buckets = args[4];
    if (!PyList_CheckExact(run) || !PyDict_CheckExact(armed) || !PyDict_CheckExact(held)
        || !PyDict_CheckExact(buckets)) {
        PyErr_SetString(PyExc_TypeError, "rearm(): run: list; armed, held, buckets: dict");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    long long watermark, bits;
    if (!bound_int(args[5], &watermark) || !small_int(args[6], &bits) || bits < 0 || bits > 62) {
        if (PyErr_Occurred()) return NULL;
        return PyLong_FromSsize_t(i);
    }
    for (; i < PyList_GET_SIZE(run); i++) { /* its length now, as in Python */
        /* run[i], from the end for a negative i as in Python; ours: a key's __eq__ may
         * change the run */
        PyObject *entry = PySequence_GetItem(run, i);
        if (entry == NULL) return NULL;
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) {
            Py_DECREF(entry);
            break;
        }
        int step = rearm_one(entry, armed, held, buckets, watermark, bits);
        Py_DECREF(entry);
        if (step < 0) return NULL;
        if (step == 0) break;
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "fold(batch, i, held, key_selector, timestamp, add, gap, after, added, failed) -> int"},
    {"rearm", (PyCFunction)(void (*)(void))rearm, METH_FASTCALL,
     "rearm(run, i, armed, held, buckets, watermark, bits) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_session_speedups",
    "C twins of aiostream_ckpt.runtime.windowing.session_fold's loops.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__session_speedups(void) { return PyModule_Create(&module); }
