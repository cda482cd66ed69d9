/* Stub libmlx5.so.1 for uroce: Debian's perftest links against libmlx5 for
 * its DC / AES-XTS options and must find these names at load time. uroce is
 * not an mlx5 device, so every function fails with EOPNOTSUPP, exactly as
 * the real library does for a non-mlx5 device. */
#include <errno.h>
#include <stddef.h>

void *mlx5dv_create_mkey(void *attr) { (void)attr; errno = EOPNOTSUPP; return NULL; }
int mlx5dv_destroy_mkey(void *mkey) { (void)mkey; return EOPNOTSUPP; }
void *mlx5dv_create_qp(void *ctx, void *attr_ex, void *mlx5_attr)
{ (void)ctx; (void)attr_ex; (void)mlx5_attr; errno = EOPNOTSUPP; return NULL; }
int mlx5dv_crypto_login(void *ctx, void *attr) { (void)ctx; (void)attr; return EOPNOTSUPP; }
void *mlx5dv_dek_create(void *ctx, void *attr) { (void)ctx; (void)attr; errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dek_destroy(void *dek) { (void)dek; return EOPNOTSUPP; }
int mlx5dv_devx_general_cmd(void *ctx, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)ctx; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
void *mlx5dv_open_device(void *device, void *attr) { (void)device; (void)attr; errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp) { (void)qp; return NULL; }
int mlx5dv_is_supported(void *device) { (void)device; return 0; }
