/* Stub libefa.so.1 for uroce: Debian's perftest and libfabric link against
 * libefa (perftest's SRD option, libfabric's efa provider). uroce is not an
 * EFA device: every function fails with EOPNOTSUPP, as the real library does
 * for a non-EFA device, so those programs fall back to plain verbs. */
#include <errno.h>
#include <stddef.h>

void *efadv_create_driver_qp(void *pd, void *attr, unsigned int driver_qp_type)
{ (void)pd; (void)attr; (void)driver_qp_type; errno = EOPNOTSUPP; return NULL; }
void *efadv_create_qp_ex(void *ctx, void *attr_ex, void *efa_attr, unsigned int inlen)
{ (void)ctx; (void)attr_ex; (void)efa_attr; (void)inlen; errno = EOPNOTSUPP; return NULL; }
int efadv_query_device(void *ctx, void *attr, unsigned int inlen)
{ (void)ctx; (void)attr; (void)inlen; return EOPNOTSUPP; }
int efadv_query_ah(void *ah, void *attr, unsigned int inlen)
{ (void)ah; (void)attr; (void)inlen; return EOPNOTSUPP; }
void *efadv_create_cq(void *ctx, void *attr_ex, void *efa_attr, unsigned int inlen)
{ (void)ctx; (void)attr_ex; (void)efa_attr; (void)inlen; errno = EOPNOTSUPP; return NULL; }
/* Only a CQ made by efadv_create_cq has an EFA view, and none can be. */
void *efadv_cq_from_ibv_cq_ex(void *cq)
{ (void)cq; return NULL; }
