/* Stub libefa.so.1 for uroce: Debian's perftest links against libefa for
 * its SRD option. uroce is not an EFA device: every function fails with
 * EOPNOTSUPP, as the real library does for a non-EFA device. */
#include <errno.h>
#include <stddef.h>

void *efadv_create_qp_ex(void *ctx, void *attr_ex, void *efa_attr, unsigned int inlen)
{ (void)ctx; (void)attr_ex; (void)efa_attr; (void)inlen; errno = EOPNOTSUPP; return NULL; }
int efadv_query_device(void *ctx, void *attr, unsigned int inlen)
{ (void)ctx; (void)attr; (void)inlen; return EOPNOTSUPP; }
