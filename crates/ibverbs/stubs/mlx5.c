/* Stub libmlx5.so.1 for uroce: Debian's perftest (DC, AES-XTS options) and
 * UCX's libuct_ib (its mlx5 accelerated transports) link against libmlx5 and
 * must find these names, under the real library's version nodes, at load
 * time. uroce is not an mlx5 device: mlx5dv_is_supported says no (so UCX
 * uses its plain verbs transports) and every other function fails with
 * EOPNOTSUPP, exactly as the real library does for a non-mlx5 device. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#define NULL_EOPNOTSUPP { errno = EOPNOTSUPP; return NULL; }

/* MLX5_1.1 - 1.3 */
void *mlx5dv_create_cq(void *ctx, void *attr, void *mlx5_attr)
{ (void)ctx; (void)attr; (void)mlx5_attr; NULL_EOPNOTSUPP }
int mlx5dv_init_obj(void *obj, uint64_t type) { (void)obj; (void)type; return EOPNOTSUPP; }
void *mlx5dv_create_qp(void *ctx, void *attr_ex, void *mlx5_attr)
{ (void)ctx; (void)attr_ex; (void)mlx5_attr; NULL_EOPNOTSUPP }
/* MLX5_1.7 */
void *mlx5dv_open_device(void *device, void *attr) { (void)device; (void)attr; NULL_EOPNOTSUPP }
int mlx5dv_devx_general_cmd(void *ctx, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)ctx; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
void *mlx5dv_devx_obj_create(void *ctx, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)ctx; (void)in; (void)inlen; (void)out; (void)outlen; NULL_EOPNOTSUPP }
int mlx5dv_devx_obj_query(void *obj, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)obj; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
int mlx5dv_devx_obj_modify(void *obj, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)obj; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
int mlx5dv_devx_obj_destroy(void *obj) { (void)obj; return EOPNOTSUPP; }
void *mlx5dv_devx_umem_reg(void *ctx, void *addr, size_t size, uint32_t access)
{ (void)ctx; (void)addr; (void)size; (void)access; NULL_EOPNOTSUPP }
int mlx5dv_devx_umem_dereg(void *umem) { (void)umem; return EOPNOTSUPP; }
void *mlx5dv_devx_alloc_uar(void *ctx, uint32_t flags) { (void)ctx; (void)flags; NULL_EOPNOTSUPP }
void mlx5dv_devx_free_uar(void *uar) { (void)uar; }
/* MLX5_1.8 */
int mlx5dv_is_supported(void *device) { (void)device; return 0; }
int mlx5dv_devx_qp_query(void *qp, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)qp; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
int mlx5dv_devx_qp_modify(void *qp, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)qp; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
/* MLX5_1.10 */
void *mlx5dv_create_mkey(void *attr) { (void)attr; NULL_EOPNOTSUPP }
int mlx5dv_destroy_mkey(void *mkey) { (void)mkey; return EOPNOTSUPP; }
void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp) { (void)qp; return NULL; }
/* MLX5_1.11 */
void *mlx5dv_devx_create_event_channel(void *ctx, int flags) { (void)ctx; (void)flags; NULL_EOPNOTSUPP }
void mlx5dv_devx_destroy_event_channel(void *ch) { (void)ch; }
int mlx5dv_devx_subscribe_devx_event(void *ch, void *obj, uint16_t len, uint16_t *nums, uint64_t cookie)
{ (void)ch; (void)obj; (void)len; (void)nums; (void)cookie; return EOPNOTSUPP; }
long mlx5dv_devx_get_event(void *ch, void *data, size_t len)
{ (void)ch; (void)data; (void)len; errno = EOPNOTSUPP; return -1; }
/* MLX5_1.21 */
int mlx5dv_crypto_login(void *ctx, void *attr) { (void)ctx; (void)attr; return EOPNOTSUPP; }
void *mlx5dv_dek_create(void *ctx, void *attr) { (void)ctx; (void)attr; NULL_EOPNOTSUPP }
int mlx5dv_dek_destroy(void *dek) { (void)dek; return EOPNOTSUPP; }
