/* The Linux BSP's --logits-out file, where bsp_logits_sink (hooks.c) writes every step's logits. */
#ifndef COLIBRI_BSP_LINUX_HOOKS_H
#define COLIBRI_BSP_LINUX_HOOKS_H

/* Open the file every step's logits are appended to (float32, as they lie in memory): 0, or -1 when
 * it cannot be opened. */
int logits_out_open(const char *path);

/* Close it, if one is open. */
void logits_out_close(void);

#endif
