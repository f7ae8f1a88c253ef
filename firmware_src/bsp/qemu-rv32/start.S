/* Startup for qemu-system-riscv32 -M virt (rv32imafc, machine mode, no firmware underneath): the
 * shared bare-metal start-up; bsp_exit ends the emulator with main's return value. */
#define TRAP_ALIGN 4 /* mtvec in direct mode: its low two bits are the mode */
#include "../rv32-common/start.S"
