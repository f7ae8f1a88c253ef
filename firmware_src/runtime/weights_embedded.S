/* Boards whose weight image is part of the firmware (runner.weights = "embedded"): the image,
 * 64-byte aligned, between colibri_weights_image and colibri_weights_end. The build passes the
 * generated directory to the assembler's include path. */
    .section .rodata.colibri_weights, "a"
    .balign 64
    .global colibri_weights_image
colibri_weights_image:
    .incbin "weights.img"
    .global colibri_weights_end
colibri_weights_end:
