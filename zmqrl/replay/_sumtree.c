/* Compiled kernels for zmqrl.replay.sumtree: the same tree, the same arithmetic, no numpy calls.
 *
 * Why C: the numpy sum tree (sumtree.py, the reference) walks the tree one level per numpy call,
 * so a batch of 256 costs ~17 levels x several calls of fixed overhead; prioritized replay then
 * cost ~10x uniform replay per training step. Here one call does a whole batch.
 *
 * The tree stays a numpy float64 array owned by Python (sumtree.CompiledSumTree._nodes); these
 * functions only read and write it through the buffer protocol, so the module needs no numpy
 * headers to build, and both implementations share one layout (see sumtree.py): node 1 is the
 * root, node k has children 2k and 2k+1, leaf i is node P + i, P = len(nodes) / 2 a power of two.
 *
 * Every result is bit for bit the reference's: each internal node is computed as left + right
 * from its final children, and a descent performs the same comparisons and subtractions, in the
 * same order, on the same doubles (no expression here has the a * b + c form a compiler could
 * fuse). Every function validates all of its input before it writes anything, so a failed call
 * changes nothing (the replay's transactions rely on that).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The GIL is released only around loops of more than this many node visits. A learner step's
 * batch (hundreds of items, microseconds) keeps it: a thread that gives the GIL up can wait a
 * whole switch interval (5 ms) to get it back from another busy thread (the ingest thread),
 * which would cost far more than the call. numpy makes the same trade for small arrays. */
#define RELEASE_GIL_ABOVE (1 << 16)

/* PyEval_SaveThread when `n` items each visiting every level of a tree with `leaf0` leaves are
 * work enough to be worth it (see RELEASE_GIL_ABOVE), else NULL. */
static PyThreadState *release_gil_for(Py_ssize_t n, Py_ssize_t leaf0) {
    Py_ssize_t work = n;
    for (Py_ssize_t width = 1; width < leaf0 && work <= RELEASE_GIL_ABOVE; width <<= 1) {
        work += n;
    }
    return work > RELEASE_GIL_ABOVE ? PyEval_SaveThread() : NULL;
}

static void reacquire_gil(PyThreadState *state) {
    if (state != NULL) {
        PyEval_RestoreThread(state);
    }
}

/* A bulk update touching at least P / REBUILD_DIVISOR leaves recomputes every internal node in
 * one contiguous pass instead of walking up from each leaf (the reference's threshold too). */
#define REBUILD_DIVISOR 8

/* Whether a buffer's struct format names one native item of kind `kind` ('d': float64, 'i':
 * signed int64, '?': bool). numpy writes int64 as 'l' or 'q', maybe after '@', '=' or '<'. */
static int format_is(const Py_buffer *view, char kind) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=') {
        f++;
    }
#if PY_LITTLE_ENDIAN
    else if (*f == '<') {
        f++;
    }
#endif
    if (f[0] == '\0' || f[1] != '\0') {
        return 0;
    }
    if (kind == '?') {
        return view->itemsize == 1 && f[0] == '?';
    }
    if (view->itemsize != 8) {
        return 0;
    }
    if (kind == 'd') {
        return f[0] == 'd';
    }
    return f[0] == 'q' || (sizeof(long) == 8 && f[0] == 'l');
}

/* Acquire a C-contiguous buffer of one item kind (see format_is); 0 with TypeError set otherwise. */
static int get_array(PyObject *obj, Py_buffer *view, char kind, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return 0;
    }
    if (!format_is(view, kind)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s array", what,
                     kind == 'd' ? "float64" : kind == '?' ? "bool" : "int64");
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* One array argument: the object, its item kind, whether it is written, its name for errors. */
typedef struct {
    PyObject *obj;
    char kind;
    int writable;
    const char *what;
} Arg;

/* Acquire every argument's buffer into views[0 .. count - 1]; on failure none stays held. */
static int get_arrays(const Arg *args, Py_buffer *views, int count) {
    for (int i = 0; i < count; i++) {
        if (!get_array(args[i].obj, &views[i], args[i].kind, args[i].writable, args[i].what)) {
            while (i > 0) {
                PyBuffer_Release(&views[--i]);
            }
            return 0;
        }
    }
    return 1;
}

static void release_arrays(Py_buffer *views, int count) {
    while (count > 0) {
        PyBuffer_Release(&views[--count]);
    }
}

/* Items in an acquired buffer of 8-byte (or, for bool, 1-byte) items. */
static Py_ssize_t items(const Py_buffer *view) { return view->len / view->itemsize; }

/* The tree's node array and its shape: P (index of leaf 0) and the usable capacity. */
typedef struct {
    Py_buffer view;
    double *nodes;
    Py_ssize_t leaf0;
    Py_ssize_t capacity;
} Tree;

static int get_tree(PyObject *obj, Py_ssize_t capacity, Tree *tree, int writable) {
    if (!get_array(obj, &tree->view, 'd', writable, "nodes")) {
        return 0;
    }
    Py_ssize_t n = tree->view.len / 8;
    Py_ssize_t p = n / 2;
    if (n < 2 || n % 2 || (p & (p - 1)) || capacity < 1 || capacity > p) {
        PyErr_SetString(PyExc_ValueError, "nodes is not a sum tree of that capacity");
        PyBuffer_Release(&tree->view);
        return 0;
    }
    tree->nodes = (double *)tree->view.buf;
    tree->leaf0 = p;
    tree->capacity = capacity;
    return 1;
}

static int check_leaves(const int64_t *leaves, Py_ssize_t n, Py_ssize_t capacity) {
    for (Py_ssize_t j = 0; j < n; j++) {
        if (leaves[j] < 0 || leaves[j] >= capacity) {
            PyErr_Format(PyExc_ValueError, "leaf index out of range [0, %zd)", capacity);
            return 0;
        }
    }
    return 1;
}

/* The descent of sumtree.SumTree.find_prefix_sum, one level at a time for the whole batch as the
 * reference does: at each level a target goes right only when it reaches past the left child's
 * sum and the right subtree is non-empty. Level by level rather than target by target because
 * the batch's loads within a level are independent, so their cache misses overlap instead of
 * forming one chain of log2(P) dependent misses per target. `node` holds node numbers on entry
 * (all 1) and leaf nodes on return; `t` the clipped targets, consumed. */
static void descend(const double *nodes, Py_ssize_t leaf0, Py_ssize_t n, int64_t *node, double *t) {
    for (Py_ssize_t width = 1; width < leaf0; width <<= 1) {
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t k = node[j] << 1; /* left child */
            double left = nodes[k];
            int go_right = (t[j] >= left) & (nodes[k + 1] > 0);
            /* t -= go_right ? left : +0.0, without a branch (it would mispredict half the
             * time): subtracting +0.0 leaves every double, -0.0 included, unchanged. */
            uint64_t bits;
            memcpy(&bits, &left, sizeof bits);
            bits &= (uint64_t)0 - (uint64_t)go_right;
            double sub;
            memcpy(&sub, &bits, sizeof sub);
            t[j] -= sub;
            node[j] = k + go_right;
        }
    }
}

static inline double clip(double t, double total) {
    if (t < 0.0) {
        return 0.0;
    }
    return t > total ? total : t;
}

/* Set leaves[j] to values[j] in order (a repeated leaf keeps its last value), then make every
 * ancestor the sum of its children again; the input is valid. */
static void write_leaves(double *nodes, Py_ssize_t p, const int64_t *leaves, const double *values,
                         Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j++) {
        nodes[p + leaves[j]] = values[j];
    }
    if (n * REBUILD_DIVISOR >= p) {
        for (Py_ssize_t k = p - 1; k >= 1; k--) {
            nodes[k] = nodes[2 * k] + nodes[2 * k + 1];
        }
        return;
    }
    /* Level by level from the leaves up, as the reference: each level's parents are computed
     * from children that are already final (a parent shared by several leaves is written several
     * times with the same value). Within a level the loads are independent, so their cache
     * misses overlap. */
    for (int shift = 1; (p >> shift) >= 1; shift++) {
        Py_ssize_t last = 0; /* no node: node 0 is unused */
        for (Py_ssize_t j = 0; j < n; j++) {
            Py_ssize_t k = (p + leaves[j]) >> shift;
            if (k != last) { /* sorted leaves (a stratified draw's) share parents near the root */
                nodes[k] = nodes[2 * k] + nodes[2 * k + 1];
                last = k;
            }
        }
    }
}

PyDoc_STRVAR(update_doc,
             "update(nodes, capacity, leaves, values)\n--\n\n"
             "Set leaves (int64) to values (float64) in order (a repeated leaf keeps its last value) "
             "and refresh their ancestors. ValueError, with nothing written, for an index out of "
             "range, mismatched lengths, or a value that is negative or not finite.");

static PyObject *sumtree_update(PyObject *self, PyObject *args) {
    PyObject *nodes_obj, *leaves_obj, *values_obj;
    Py_ssize_t capacity;
    Tree tree;
    Py_buffer v[2];
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "OnOO:update", &nodes_obj, &capacity, &leaves_obj, &values_obj) ||
        !get_tree(nodes_obj, capacity, &tree, 1)) {
        return NULL;
    }
    const Arg spec[2] = {{leaves_obj, 'i', 0, "leaves"}, {values_obj, 'd', 0, "values"}};
    if (!get_arrays(spec, v, 2)) {
        PyBuffer_Release(&tree.view);
        return NULL;
    }
    const int64_t *leaves = v[0].buf;
    const double *values = v[1].buf;
    Py_ssize_t n = items(&v[0]);
    if (!check_leaves(leaves, n, capacity)) {
        goto done;
    }
    if (items(&v[1]) != n) {
        PyErr_Format(PyExc_ValueError, "got %zd indices but %zd values", n, items(&v[1]));
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!(isfinite(values[j]) && values[j] >= 0)) {
            PyErr_SetString(PyExc_ValueError, "sum tree values must be finite and >= 0");
            goto done;
        }
    }
    PyThreadState *state = release_gil_for(n, tree.leaf0);
    write_leaves(tree.nodes, tree.leaf0, leaves, values, n);
    reacquire_gil(state);
    result = Py_NewRef(Py_None);
done:
    release_arrays(v, 2);
    PyBuffer_Release(&tree.view);
    return result;
}

PyDoc_STRVAR(update_current_doc,
             "update_current(nodes, capacity, ids, values, owners, out_live)\n--\n\n"
             "For each j whose leaf ids[j] % capacity still holds id ids[j] (owners[leaf] == "
             "ids[j], owners int64 of length capacity), set that leaf to values[j], as update() "
             "does; out_live[j] (bool) says which; returns how many. ValueError, with "
             "nothing written, for mismatched lengths, a negative id, or a value to be written "
             "that is negative or not finite.");

static PyObject *sumtree_update_current(PyObject *self, PyObject *args) {
    PyObject *nodes_obj, *ids_obj, *values_obj, *owners_obj, *live_obj;
    Py_ssize_t capacity;
    Tree tree;
    Py_buffer v[4];
    PyObject *result = NULL;
    int64_t *slots = NULL;
    double *kept = NULL;
    if (!PyArg_ParseTuple(args, "OnOOOO:update_current", &nodes_obj, &capacity, &ids_obj, &values_obj,
                          &owners_obj, &live_obj) ||
        !get_tree(nodes_obj, capacity, &tree, 1)) {
        return NULL;
    }
    const Arg spec[4] = {{ids_obj, 'i', 0, "ids"},
                         {values_obj, 'd', 0, "values"},
                         {owners_obj, 'i', 0, "owners"},
                         {live_obj, '?', 1, "out_live"}};
    if (!get_arrays(spec, v, 4)) {
        PyBuffer_Release(&tree.view);
        return NULL;
    }
    const int64_t *ids = v[0].buf;
    const double *values = v[1].buf;
    const int64_t *owners = v[2].buf;
    unsigned char *live = v[3].buf;
    Py_ssize_t n = items(&v[0]);
    if (items(&v[1]) != n || items(&v[3]) != n) {
        PyErr_Format(PyExc_ValueError, "got %zd indices but %zd values", n, items(&v[1]));
        goto done;
    }
    if (items(&v[2]) != capacity) {
        PyErr_SetString(PyExc_ValueError, "owners must have one item per leaf");
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (ids[j] < 0) {
            PyErr_SetString(PyExc_ValueError, "ids must be >= 0");
            goto done;
        }
    }
    /* The live ones' leaves and values, compacted, so that write_leaves() sees only them. */
    slots = PyMem_Malloc((n ? n : 1) * sizeof *slots);
    kept = PyMem_Malloc((n ? n : 1) * sizeof *kept);
    if (slots == NULL || kept == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_live = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t slot = ids[j] % capacity;
        live[j] = owners[slot] == ids[j];
        if (live[j]) {
            if (!(isfinite(values[j]) && values[j] >= 0)) {
                PyErr_SetString(PyExc_ValueError, "sum tree values must be finite and >= 0");
                goto done;
            }
            slots[n_live] = slot;
            kept[n_live] = values[j];
            n_live++;
        }
    }
    PyThreadState *state = release_gil_for(n_live, tree.leaf0);
    write_leaves(tree.nodes, tree.leaf0, slots, kept, n_live);
    reacquire_gil(state);
    result = PyLong_FromSsize_t(n_live);
done:
    PyMem_Free(kept);
    PyMem_Free(slots);
    release_arrays(v, 4);
    PyBuffer_Release(&tree.view);
    return result;
}

PyDoc_STRVAR(get_doc, "get(nodes, capacity, leaves, out)\n--\n\n"
                      "out[j] = value of leaf leaves[j]; ValueError for an index out of range.");

static PyObject *sumtree_get(PyObject *self, PyObject *args) {
    PyObject *nodes_obj, *leaves_obj, *out_obj;
    Py_ssize_t capacity;
    Tree tree;
    Py_buffer v[2];
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "OnOO:get", &nodes_obj, &capacity, &leaves_obj, &out_obj) ||
        !get_tree(nodes_obj, capacity, &tree, 0)) {
        return NULL;
    }
    const Arg spec[2] = {{leaves_obj, 'i', 0, "leaves"}, {out_obj, 'd', 1, "out"}};
    if (!get_arrays(spec, v, 2)) {
        PyBuffer_Release(&tree.view);
        return NULL;
    }
    const int64_t *leaves = v[0].buf;
    double *out = v[1].buf;
    Py_ssize_t n = items(&v[0]);
    if (items(&v[1]) != n) {
        PyErr_SetString(PyExc_ValueError, "out must have one item per leaf");
        goto done;
    }
    if (!check_leaves(leaves, n, capacity)) {
        goto done;
    }
    const double *leaf = tree.nodes + tree.leaf0;
    for (Py_ssize_t j = 0; j < n; j++) {
        out[j] = leaf[leaves[j]];
    }
    result = Py_NewRef(Py_None);
done:
    release_arrays(v, 2);
    PyBuffer_Release(&tree.view);
    return result;
}

/* find() and stratified() share everything but how a target is made from an input. */
static PyObject *search(PyObject *args, int stratified) {
    PyObject *nodes_obj, *in_obj, *leaves_obj, *values_obj;
    Py_ssize_t capacity;
    Tree tree;
    Py_buffer v[3];
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, stratified ? "OnOOO:stratified" : "OnOOO:find", &nodes_obj, &capacity,
                          &in_obj, &leaves_obj, &values_obj) ||
        !get_tree(nodes_obj, capacity, &tree, 0)) {
        return NULL;
    }
    const Arg spec[3] = {{in_obj, 'd', 0, stratified ? "uniforms" : "targets"},
                         {leaves_obj, 'i', 1, "out_leaves"},
                         {values_obj, 'd', 1, "out_values"}};
    if (!get_arrays(spec, v, 3)) {
        PyBuffer_Release(&tree.view);
        return NULL;
    }
    const double *in = v[0].buf;
    int64_t *out_leaves = v[1].buf;
    double *out_values = v[2].buf;
    const double *nodes = tree.nodes;
    Py_ssize_t p = tree.leaf0;
    Py_ssize_t n = items(&v[0]);
    double total = nodes[1];
    if (items(&v[1]) != n || items(&v[2]) != n) {
        PyErr_SetString(PyExc_ValueError, "outputs must have one item per target");
        goto done;
    }
    if (!(total > 0)) {
        PyErr_SetString(PyExc_ValueError, "cannot search a sum tree whose total is zero");
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!isfinite(in[j])) {
            PyErr_SetString(PyExc_ValueError, stratified ? "uniform draws must be finite"
                                                         : "prefix-sum targets must be finite");
            goto done;
        }
    }
    /* Stratum j is [j, j + 1) * total / n: the reference computes (arange(n) + u) * (total / n).
     * The outputs serve as the descent's work arrays: out_values holds the targets until the
     * last step replaces them with the drawn leaves' values. */
    double scale = n ? total / (double)n : 0.0;
    PyThreadState *state = release_gil_for(n, p);
    for (Py_ssize_t j = 0; j < n; j++) {
        out_values[j] = clip(stratified ? ((double)j + in[j]) * scale : in[j], total);
        out_leaves[j] = 1;
    }
    descend(nodes, p, n, out_leaves, out_values);
    for (Py_ssize_t j = 0; j < n; j++) {
        out_values[j] = nodes[out_leaves[j]];
        out_leaves[j] -= p;
    }
    reacquire_gil(state);
    result = Py_NewRef(Py_None);
done:
    release_arrays(v, 3);
    PyBuffer_Release(&tree.view);
    return result;
}

PyDoc_STRVAR(find_doc,
             "find(nodes, capacity, targets, out_leaves, out_values)\n--\n\n"
             "For each target, the leaf whose prefix-sum interval holds it (targets clipped to "
             "[0, total]) and that leaf's value. ValueError when the total is zero or a target is "
             "not finite.");

static PyObject *sumtree_find(PyObject *self, PyObject *args) { return search(args, 0); }

PyDoc_STRVAR(stratified_doc,
             "stratified(nodes, capacity, uniforms, out_leaves, out_values)\n--\n\n"
             "find() for targets (j + uniforms[j]) * total / n: one draw in each of n equal "
             "segments of [0, total).");

static PyObject *sumtree_stratified(PyObject *self, PyObject *args) { return search(args, 1); }

PyDoc_STRVAR(check_doc, "all_finite_nonnegative(values)\n--\n\n"
                        "Whether every float64 in values is finite and >= 0.");

static PyObject *sumtree_all_finite_nonnegative(PyObject *self, PyObject *obj) {
    Py_buffer vv;
    if (!get_array(obj, &vv, 'd', 0, "values")) {
        return NULL;
    }
    const double *values = vv.buf;
    Py_ssize_t n = items(&vv);
    int ok = 1;
    for (Py_ssize_t j = 0; j < n && ok; j++) {
        ok = isfinite(values[j]) && values[j] >= 0;
    }
    PyBuffer_Release(&vv);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"update", sumtree_update, METH_VARARGS, update_doc},
    {"update_current", sumtree_update_current, METH_VARARGS, update_current_doc},
    {"get", sumtree_get, METH_VARARGS, get_doc},
    {"find", sumtree_find, METH_VARARGS, find_doc},
    {"stratified", sumtree_stratified, METH_VARARGS, stratified_doc},
    {"all_finite_nonnegative", sumtree_all_finite_nonnegative, METH_O, check_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_sumtree",
    .m_doc = "Compiled sum-tree kernels over a numpy float64 node array (see zmqrl/replay/sumtree.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__sumtree(void) { return PyModule_Create(&module); }
