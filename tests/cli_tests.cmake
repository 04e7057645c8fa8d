# Command-line programs given bad flags and bad files (included by tests/CMakeLists.txt). Each test runs a program
# as a user would and requires its documented exit status and a message that names the bad flag or file.
