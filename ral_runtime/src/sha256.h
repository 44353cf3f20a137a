/* SHA-256 (FIPS 180-4), used to check the checksum of .disc artifacts. Internal to the RAL. */
#ifndef RAL_SHA256_H
#define RAL_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t state[8];
  uint64_t total_bytes; /* message length so far */
  uint8_t block[64];    /* a partial block waiting for more bytes */
  size_t block_used;
} disc_sha256_ctx;

void disc_sha256_init(disc_sha256_ctx *c);
void disc_sha256_update(disc_sha256_ctx *c, const void *data, size_t size);
void disc_sha256_final(disc_sha256_ctx *c, uint8_t digest[32]);
/* One-shot digest of a buffer. */
void disc_sha256(const void *data, size_t size, uint8_t digest[32]);

#endif
