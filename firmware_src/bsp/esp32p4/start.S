/* ESP32-P4 HP core startup, entered by the ROM loader after it copied this image from flash
 * offset 0x2000 into L2MEM: the shared bare-metal start-up. */
#define TRAP_ALIGN 64
#include "../rv32-common/start.S"
