/*
 * m27.checkpoint._spans: xxh3_64 of many chunks of one buffer in a single call.
 *
 * The pure-Python path calls xxhash once per chunk; between two calls the thread gives
 * the GIL back and takes it again, which costs more than the hashing when two threads
 * share 8,192 chunks of 128 KiB (see m27/checkpoint/_chunks.py). Here one call hashes a
 * whole range of chunks with the GIL released, so two threads run at memory speed and a
 * save needs no group pass. The values are exactly xxhash.xxh3_64_intdigest of each
 * chunk (XXH3_64bits, seed 0): they are stored in manifests and compared across saves
 * and builds, so the fallback and this module must agree bit for bit (a test checks it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include "third_party/xxhash/xxhash.h"

/* Chunk `index` of `data` ([start, start + chunk) cut at the buffer's end). */
static XXH64_hash_t hash_one(const char *data, Py_ssize_t nbytes, Py_ssize_t chunk,
                             Py_ssize_t index) {
    Py_ssize_t start = index * chunk;
    Py_ssize_t length = nbytes - start < chunk ? nbytes - start : chunk;
    return XXH3_64bits(data + start, (size_t)length);
}

/* Checks shared by both entry points; sets a Python error and returns 0 on a bad call. */
static int check(Py_buffer *data, Py_buffer *out, Py_ssize_t chunk, Py_ssize_t *count) {
    if (chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_size must be positive");
        return 0;
    }
    if (out->len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "out must hold whole uint64 values");
        return 0;
    }
    *count = out->len / 8;
    (void)data;
    return 1;
}

PyDoc_STRVAR(hash_range_doc,
"hash_range(data, chunk_size, first, out) -> None\n\n"
"Write xxh3_64 of chunks first, first+1, ... of `data` into `out` (native uint64, one\n"
"per 8 bytes of `out`), with the GIL released.");

static PyObject *hash_range(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    Py_ssize_t chunk, first, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnw*", &data, &chunk, &first, &out)) return NULL;
    if (!check(&data, &out, chunk, &count)) goto fail;
    Py_ssize_t total = data.len == 0 ? 0 : (data.len - 1) / chunk + 1;
    if (first < 0 || first > total || count > total - first) {
        PyErr_Format(PyExc_ValueError, "chunks %zd..%zd outside the buffer's %zd chunks",
                     first, first + count, total);
        goto fail;
    }
    uint64_t *dest = (uint64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) dest[i] = hash_one(data.buf, data.len, chunk, first + i);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return NULL;
}

PyDoc_STRVAR(hash_indices_doc,
"hash_indices(data, chunk_size, indices, out) -> None\n\n"
"Write xxh3_64 of the chunks at `indices` (native int64) of `data` into `out`, with the\n"
"GIL released.");

static PyObject *hash_indices(PyObject *self, PyObject *args) {
    Py_buffer data, indices, out;
    Py_ssize_t chunk, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*w*", &data, &chunk, &indices, &out)) return NULL;
    if (!check(&data, &out, chunk, &count)) goto fail;
    if (indices.len != out.len) {
        PyErr_SetString(PyExc_ValueError, "indices and out must have the same length");
        goto fail;
    }
    Py_ssize_t total = data.len == 0 ? 0 : (data.len - 1) / chunk + 1;
    const int64_t *index = (const int64_t *)indices.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (index[i] < 0 || index[i] >= total) {
            PyErr_Format(PyExc_ValueError, "chunk %lld outside the buffer's %zd chunks",
                         (long long)index[i], total);
            goto fail;
        }
    }
    uint64_t *dest = (uint64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) dest[i] = hash_one(data.buf, data.len, chunk, index[i]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&indices);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&data);
    PyBuffer_Release(&indices);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"hash_range", hash_range, METH_VARARGS, hash_range_doc},
    {"hash_indices", hash_indices, METH_VARARGS, hash_indices_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "m27.checkpoint._spans",
    "xxh3_64 of many chunks of one buffer per call, with the GIL released.", -1, methods,
};

PyMODINIT_FUNC PyInit__spans(void) { return PyModule_Create(&module); }
