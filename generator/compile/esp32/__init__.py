"""The ESP32 family: app and flash images (esptool), partition tables, the generated ESP-IDF
project and idf.py."""
