/* ESP32-P4 HP core startup, entered by the ROM loader after it copied this image from flash
 * offset 0x2000 into L2MEM: gp/sp, FPU on, trap handler, .bss cleared, then main. */
    .section .text.start, "ax"
    .global _start
_start:
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop
    la sp, __stack_top
    la tp, __tls_base
    li t0, 0x6000           /* mstatus.FS = dirty: enable the F extension */
    csrs mstatus, t0
    csrwi fcsr, 0
    la t0, trap_entry
    csrw mtvec, t0
    la t0, __bss_start
    la t1, __bss_end
1:  bgeu t0, t1, 2f
    sw zero, 0(t0)
    addi t0, t0, 4
    j 1b
2:  call main
3:  j 3b

    .balign 64
trap_entry:
    la sp, __stack_top
    csrr a0, mcause
    csrr a1, mepc
    csrr a2, mtval
    call bsp_trap
4:  j 4b
