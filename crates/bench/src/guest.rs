//! Guests for the VM-boot experiment (UKSM §8.2.1, scaled): QEMU under TCG
//! booting Debian's kernel with a busybox initramfs built from Debian packages.
