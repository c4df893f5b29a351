// The maker of a precompiled header that other targets reuse (CMakeLists.txt, "precompiled headers").
int main() { return 0; }
