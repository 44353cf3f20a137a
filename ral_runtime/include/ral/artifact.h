/* Loading and calling .disc artifacts (docs/artifact.md) from C, with no compiler in the process.
 *
 * Ownership rules:
 *  - disc_artifact_load maps the file read-only and loads its shared object; the artifact owns
 *    both, and every string and array its queries return, until disc_artifact_free. It is
 *    read-only after loading: any number of threads may query it and run call objects made from
 *    it at the same time.
 *  - The ral_runtime passed to disc_artifact_load must outlive the artifact, and the artifact
 *    must outlive every call object made from it. libdisc_ral must be in the process's global
 *    symbol scope (linked into the program, or dlopen'd with RTLD_GLOBAL): the shared object
 *    resolves the RAL's entry points there.
 *  - A disc_call belongs to one thread at a time (use one per thread). It keeps pointers to the
 *    caller's input buffers from disc_call_bind_input until the next bind or disc_call_free:
 *    they must stay valid through disc_call_run. It owns its outputs: the pointers
 *    disc_call_output returns are valid until the next disc_call_run or disc_call_free.
 *  - Errors never abort. Every function that fails returns a status other than RAL_OK (or NULL)
 *    and leaves a message saying what was wrong (which check, which input, which dim, expected
 *    vs seen) in disc_last_error() of the calling thread. The message stays until the next
 *    failure on that thread; successful calls do not clear it.
 */
#ifndef RAL_ARTIFACT_H
#define RAL_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "ral/ral.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DISC_ARTIFACT_FORMAT_VERSION 1

typedef enum {
  DISC_DTYPE_INVALID = 0,
  DISC_F16,
  DISC_BF16,
  DISC_F32,
  DISC_F64,
  DISC_I1, /* one byte per element */
  DISC_I8,
  DISC_I16,
  DISC_I32,
  DISC_I64,
  DISC_UI8,
  DISC_UI16,
  DISC_UI32,
  DISC_UI64,
  DISC_COMPLEX_F32,
  DISC_COMPLEX_F64,
} disc_dtype;

/* The header's name of an element type ("f32", "complex<f64>"; "invalid" for others). */
const char *disc_dtype_name(disc_dtype dtype);
/* Bytes per element, 0 for DISC_DTYPE_INVALID. */
size_t disc_dtype_size(disc_dtype dtype);
/* The element type called `name` in the header, DISC_DTYPE_INVALID if none. */
disc_dtype disc_dtype_from_name(const char *name);

/* Message of the last failed call of this API on this thread ("" if none). */
const char *disc_last_error(void);

typedef struct disc_artifact disc_artifact;

/* Reads, checks and loads an artifact: magic, format version, file size, checksum, RAL ABI
 * version, header, target (in that order, as docs/artifact.md lists them), then the shared
 * object and its entry points. On failure *out is NULL and disc_last_error() says which check
 * failed. */
ral_status disc_artifact_load(ral_runtime *rt, const char *path, disc_artifact **out);
void disc_artifact_free(disc_artifact *artifact);

/* An input or output as the header declares it. */
typedef struct {
  const char *name;
  disc_dtype dtype;
  const char *dtype_name;
  int rank;
  const int64_t *dims;          /* [rank]: the static size, or -1 for a dimension variable */
  const char *const *dim_names; /* [rank]: the dimension variable's name, NULL for static dims */
} disc_tensor_spec;

int disc_artifact_num_inputs(const disc_artifact *artifact);
int disc_artifact_num_outputs(const disc_artifact *artifact);
/* The spec of input / output i, NULL when i is out of range. */
const disc_tensor_spec *disc_artifact_input(const disc_artifact *artifact, int i);
const disc_tensor_spec *disc_artifact_output(const disc_artifact *artifact, int i);
/* Address of a symbol of the artifact's shared object (e.g. a kernel, for ral_kernel_stats),
 * NULL if it has none of that name. */
void *disc_artifact_symbol(const disc_artifact *artifact, const char *name);

typedef struct disc_call disc_call;

ral_status disc_call_create(const disc_artifact *artifact, disc_call **out);
void disc_call_free(disc_call *call);

/* Binds input i to `data`: `rank` dims of sizes `shape`, strides in elements (`strides` NULL
 * means contiguous). The data must be row-major contiguous (dims of size 1 may have any
 * stride): anything else is RAL_ERR_INVALID_ARGUMENT. The element type, rank and static sizes
 * are checked against the header here; dimension variables are checked across inputs by
 * disc_call_run. The buffer is read, never written, and must stay valid through the run. */
ral_status disc_call_bind_input(disc_call *call, int i, const void *data, disc_dtype dtype, int rank,
                                const int64_t *shape, const int64_t *strides);

/* Runs the function on the bound inputs: checks every input (bound, consistent dimension
 * variables) before anything runs, then the guard (a failed shape assertion gives
 * RAL_ERR_INVALID_ARGUMENT with its message), the entry, and takes the results. Outputs of a
 * previous run are released first. */
ral_status disc_call_run(disc_call *call);

/* Output i of the last successful run: its contiguous row-major data (NULL when it has no
 * element), rank and shape ([rank], owned by the call). Valid until the next run or free. The
 * element type is disc_artifact_output(artifact, i)->dtype. */
ral_status disc_call_output(const disc_call *call, int i, const void **data, int *rank, const int64_t **shape);

#ifdef __cplusplus
}
#endif
#endif
