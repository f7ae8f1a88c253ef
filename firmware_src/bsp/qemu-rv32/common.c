/* The bare-metal RISC-V BSPs' shared part (firmware_src/bsp/rv32-common), compiled as this BSP's. */
#include "../rv32-common/common.c"
