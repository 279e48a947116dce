// Linked once per library of src/ with that library whole (every object) and only the
// libraries it declares (tests/CMakeLists.txt): the program does nothing, its link is the
// check that no folder calls into a folder above it.
int main() { return 0; }
